"""What a cycle reported, to the outside: the report, Prometheus, the node view, HTTP, MQTT, Kubernetes status."""
