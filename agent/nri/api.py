"""NRI's protocol messages and the ttrpc envelope, with the pinned API version.

NRI's messages are generated at set-up time (scripts/gen-protos.sh) from the api.proto of
Debian's golang-github-containerd-nri-dev into the venv's `pbgen` package: nothing of NRI is
copied into this repository. The pin is the NRI release containerd 1.7 in Debian 13 is built
with; newer runtimes (containerd 2.x, NRI 0.8+) keep the v1alpha1 package and add fields, which
protobuf carries through unknown to us.

ttrpc's own envelope (containerd/ttrpc request.proto: Request, Response and google.rpc.Status)
is three small messages, declared here field by field into a private descriptor pool.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

NRI_VERSION = "0.6.1"
NRI_PACKAGE = "nri.pkg.api.v1alpha1"
PLUGIN_SERVICE = NRI_PACKAGE + ".Plugin"
RUNTIME_SERVICE = NRI_PACKAGE + ".Runtime"
# grpc status codes ttrpc reuses (google.golang.org/grpc/codes)
UNKNOWN = 2
UNIMPLEMENTED = 12


class NriUnavailable(Exception):
    """NRI cannot be used on this install or host; the message says why."""


def load_nri() -> ModuleType:
    try:
        return importlib.import_module("pbgen.nri.api_pb2")
    except ImportError as e:
        raise NriUnavailable(f"NRI protocol modules missing ({e}); run scripts/setup.sh") from None


_F = descriptor_pb2.FieldDescriptorProto


def _envelope() -> dict[str, Any]:
    fdp = descriptor_pb2.FileDescriptorProto(name="perfbalance/ttrpc_envelope.proto", package="ttrpc",
                                             syntax="proto3")

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name

    one, many = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
    message("KeyValue", ("key", 1, _F.TYPE_STRING, one, ""), ("value", 2, _F.TYPE_STRING, one, ""))
    message("Request", ("service", 1, _F.TYPE_STRING, one, ""), ("method", 2, _F.TYPE_STRING, one, ""),
            ("payload", 3, _F.TYPE_BYTES, one, ""), ("timeout_nano", 4, _F.TYPE_INT64, one, ""),
            ("metadata", 5, _F.TYPE_MESSAGE, many, ".ttrpc.KeyValue"))
    # google.rpc.Status without its `details` (field 3, kept as an unknown field if sent)
    message("Status", ("code", 1, _F.TYPE_INT32, one, ""), ("message", 2, _F.TYPE_STRING, one, ""))
    message("Response", ("status", 1, _F.TYPE_MESSAGE, one, ".ttrpc.Status"),
            ("payload", 2, _F.TYPE_BYTES, one, ""))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName("ttrpc." + n))
            for n in ("Request", "Response", "Status")}


_ENV = _envelope()
Request = _ENV["Request"]
Response = _ENV["Response"]
Status = _ENV["Status"]
