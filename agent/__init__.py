"""The agent: host readers, actuators, the asyncio loop and the `perfbalance` command line."""
