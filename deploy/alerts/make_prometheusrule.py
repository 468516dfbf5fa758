"""Write deploy/prometheusrule.yaml from deploy/alerts/perfbalance.rules.yaml (one source of truth).

Run: .venv/bin/python deploy/alerts/make_prometheusrule.py   (tests/ops/test_alerts.py checks
that the committed file matches).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "perfbalance.rules.yaml"
TARGET = HERE.parent / "prometheusrule.yaml"
HEADER = ("# Generated from deploy/alerts/perfbalance.rules.yaml by deploy/alerts/make_prometheusrule.py;\n"
          "# edit the rules file and regenerate. Prometheus Operator picks it up when its ruleSelector\n"
          "# matches these labels (docs/deploy.md).\n")


def render(rules_text: str) -> str:
    manifest = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "perfbalance", "namespace": "perfbalance",
                     "labels": {"app.kubernetes.io/name": "perfbalance", "app.kubernetes.io/component": "alerts"}},
        "spec": {"groups": yaml.safe_load(rules_text)["groups"]},
    }
    return HEADER + yaml.safe_dump(manifest, sort_keys=False, width=120)


def main() -> int:
    TARGET.write_text(render(SOURCE.read_text()))
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
