"""The `kubernetes:` config section and `open_pod_metadata` in each `api` mode."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from podmeta_api import NODE, Answer, FakeApi, status_body

from agent.config import Config, parse_config
from agent.discover.podmeta import KubeClient, open_pod_metadata, reconfigure
from perfbalance.errors import ConfigError, FeatureUnavailable

WEB_UID = "3f2b6c1e-8a4d-4b7e-9c15-2d6e0a1b7f93"


def config(api_mode: str, token: Path | str = "/nonexistent/token", ca: Path | str = "/nonexistent/ca.crt",
           **more: object) -> Config:
    section = {"api": api_mode, "token_file": str(token), "ca_file": str(ca), **more}
    return parse_config(json.dumps({"kubernetes": section}), source="test.yaml", node=NODE)


def test_defaults():
    k = Config().kubernetes
    assert (k.api, k.refresh_seconds, k.kata_runtime_classes) == ("auto", 30.0, "^kata")
    assert k.token_file == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert "perfbalance.io/" in k.annotation_prefixes


def test_bare_yaml_on_and_off_mean_the_words():
    on = parse_config("kubernetes: {api: on}", source="t", node=NODE)
    off = parse_config("kubernetes: {api: off}", source="t", node=NODE)
    assert (on.kubernetes.api, off.kubernetes.api) == ("on", "off")


@pytest.mark.parametrize("text, key", [
    ("kubernetes: {api: sometimes}", "kubernetes.api"),
    ("kubernetes: {refresh_seconds: 0}", "kubernetes.refresh_seconds"),
    ("kubernetes: {kata_runtime_classes: '(kata'}", "kubernetes.kata_runtime_classes"),
    ("kubernetes: {annotation_prefixes: ['']}", "kubernetes.annotation_prefixes"),
    ("kubernetes: {timeout_seconds: -1}", "kubernetes.timeout_seconds"),
    ("kubernetes: {watch: true}", "kubernetes.watch"),
])
def test_bad_settings_name_the_key(text, key):
    with pytest.raises(ConfigError) as e:
        parse_config(text, source="t.yaml", node=NODE)
    assert e.value.path == key


def test_api_on_without_in_cluster_env_fails_clearly():
    with pytest.raises(FeatureUnavailable, match=r"kubernetes.api is on but KUBERNETES_SERVICE_HOST is not set"):
        open_pod_metadata(config("on"), node=NODE, env={})


def test_api_on_without_token_fails_naming_the_file(api: FakeApi):
    with pytest.raises(FeatureUnavailable, match=r"/nonexistent/token.*cannot read service-account token"):
        open_pod_metadata(config("on", ca=api.ca_file), node=NODE, env=api.env)


def test_api_on_with_forbidden_list_fails_naming_url_and_status(api: FakeApi, token_file: Path):
    api.answer = Answer(status=403, body=status_body(403, "Forbidden", "pods is forbidden"))
    with pytest.raises(FeatureUnavailable, match=r"GET https://127.0.0.1:\d+/api/v1/pods\?.*HTTP 403 pods is forbidden"):
        open_pod_metadata(config("on", token_file, api.ca_file), node=NODE, env=api.env)


def test_api_on_in_cluster_lists_at_startup(api: FakeApi, token_file: Path):
    meta = open_pod_metadata(config("on", token_file, api.ca_file), node=NODE, env=api.env)
    assert meta is not None and len(api.seen) == 1
    assert meta.pods([WEB_UID])[WEB_UID].name == "web-7d9f8b6c5-x2k4p"
    assert len(api.seen) == 1  # the startup list is the cache


def test_api_auto_outside_a_cluster_is_off_without_error(caplog):
    caplog.set_level(logging.INFO, logger="agent.discover.podmeta")
    assert open_pod_metadata(config("auto"), node=NODE, env={}) is None
    assert "KUBERNETES_SERVICE_HOST is not set" in caplog.text


def test_api_auto_without_token_is_off(api: FakeApi):
    assert open_pod_metadata(config("auto", ca=api.ca_file), node=NODE, env=api.env) is None
    assert api.seen == []


def test_api_auto_in_cluster_defers_the_first_list_to_the_cycle(api: FakeApi, token_file: Path):
    meta = open_pod_metadata(config("auto", token_file, api.ca_file), node=NODE, env=api.env)
    assert meta is not None and api.seen == []
    assert WEB_UID in meta.pods([WEB_UID])


def test_api_off_never_asks_even_in_a_cluster(api: FakeApi, token_file: Path):
    assert open_pod_metadata(config("off", token_file, api.ca_file), node=NODE, env=api.env) is None
    assert api.seen == []


def test_config_reaches_client_and_options(api: FakeApi, token_file: Path):
    meta = open_pod_metadata(config("auto", token_file, api.ca_file, refresh_seconds=7, timeout_seconds=1.5,
                                    kata_runtime_classes="^gvisor"), node=NODE, env=api.env)
    assert meta is not None and isinstance(meta.source, KubeClient)
    assert (meta.refresh_seconds, meta.source.timeout, meta.options.kata_runtime_classes) == (7, 1.5, "^gvisor")
    assert "rdt.perfbalance.io/class" in meta.options.annotation_prefixes


def test_reconfigure_follows_a_reloaded_config(api: FakeApi, token_file: Path):
    meta = open_pod_metadata(config("auto", token_file, api.ca_file), node=NODE, env=api.env)
    assert meta is not None
    reconfigure(meta, config("auto", token_file, api.ca_file, refresh_seconds=90, annotation_max_value_bytes=8))
    assert (meta.refresh_seconds, meta.options.max_annotation_value_bytes) == (90, 8)
