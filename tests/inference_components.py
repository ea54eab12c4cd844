"""SageMaker inference components on loopback, in front of moto server (moto 5.2 has none: no
Create/Describe/List/Update/DeleteInferenceComponent, and InvokeEndpoint ignores InferenceComponentName).

A small HTTP proxy: the inference-component operations are answered here (each request validated against
botocore's service model first, as AWS would refuse it); every other request goes to moto unchanged. Once a base
component's container runs (`attach(url)`: the toolkit's serve.py with real vLLM), SageMaker's side of adapters
is played for real: each adapter component's ArtifactUrl (a tar.gz in moto's S3) is unpacked and registered with
the container (`POST /adapters {"name", "src"}`, vLLM's SageMaker route), a deleted one unregistered
(`DELETE /adapters/<name>`), and InvokeEndpoint naming a component is forwarded to the container's /invocations
with the adapter's name in X-Amzn-SageMaker-Adapter-Identifier. moto's endpoint configs need a model per
variant: one for inference components (none) gets a placeholder model there. A component is InService at once;
what this does not cover: SageMaker's placement of copies, its rolling update and rollback, scaling and the
container's download.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.botocore_model import assert_valid

OPERATIONS = {"CreateInferenceComponent", "DescribeInferenceComponent", "ListInferenceComponents",
              "UpdateInferenceComponent", "DeleteInferenceComponent"}  # fmt: skip
INVOKE = re.compile(r"^/endpoints/([^/]+)/invocations$")
ACCOUNT = "123456789012"
PLACEHOLDER = "moto-placeholder-for-inference-components"


class InferenceComponents:
    def __init__(self, moto_url: str, s3) -> None:
        self.moto_url, self.s3 = moto_url.rstrip("/"), s3
        self.components: dict[str, dict] = {}
        self.problems: list[str] = []  # requests AWS would refuse
        self.container: str | None = None
        self._placeholder = False
        self.registered: dict[str, tuple[int, str]] = {}  # adapter -> the container's answer to POST /adapters
        self.invoked: list[tuple[str, str]] = []  # (component, adapter header sent)
        self._unpacked = tempfile.TemporaryDirectory(prefix="toolkit-adapters-")
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_):
                pass

            def do_GET(self):
                self._forward(b"")

            def do_DELETE(self):
                self._forward(b"")

            def do_PUT(self):
                self._forward(self._body())

            def do_HEAD(self):
                self._forward(b"")

            def do_POST(self):
                body = self._body()
                target = (self.headers.get("X-Amz-Target") or "").removeprefix("SageMaker.")
                if target in OPERATIONS:
                    status, reply = emulator.operation(target, json.loads(body or b"{}"))
                    self._reply(status, json.dumps(reply).encode(), "application/x-amz-json-1.1")
                    return
                if target == "CreateEndpointConfig":
                    body = emulator.endpoint_config(json.loads(body))
                match = INVOKE.match(self.path.split("?")[0])
                component = self.headers.get("X-Amzn-SageMaker-Inference-Component")
                if match and component:
                    self._reply(*emulator.invoke(component, body))
                    return
                self._forward(body)

            def _body(self) -> bytes:
                if "chunked" not in (self.headers.get("Transfer-Encoding") or ""):
                    return self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = b""  # botocore streams S3 uploads as HTTP chunks (with the checksum in a trailer)
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    body += self.rfile.read(size)
                    self.rfile.readline()
                while self.rfile.readline().strip():  # trailers, up to the blank line
                    pass
                return body

            def _forward(self, body: bytes) -> None:
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("content-length", "transfer-encoding")}  # fmt: skip
                request = urllib.request.Request(emulator.moto_url + self.path, data=body or None, headers=headers,
                                                 method=self.command)  # fmt: skip
                try:
                    with urllib.request.urlopen(request, timeout=60) as response:
                        status, data, reply_headers = response.status, response.read(), response.headers
                except urllib.error.HTTPError as exc:
                    status, data, reply_headers = exc.code, exc.read(), exc.headers
                self.send_response(status)
                for key, value in reply_headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "server", "date"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    # -- the control plane ----------------------------------------------------------------------------------------

    def operation(self, name: str, params: dict) -> tuple[int, dict]:
        try:
            assert_valid("sagemaker", name, params)
        except AssertionError as exc:
            self.problems.append(str(exc))
            return 400, {"__type": "ValidationException", "message": str(exc)}
        return getattr(self, "_" + re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower())(params)

    def _missing(self, name: str) -> tuple[int, dict]:
        return 400, {"__type": "ValidationException", "message": f"Could not find inference component {name}"}

    def _create_inference_component(self, params: dict) -> tuple[int, dict]:
        name = params["InferenceComponentName"]
        if name in self.components:
            return 400, {"__type": "ValidationException", "message": f"Cannot create already existing {name}"}
        base = params["Specification"].get("BaseInferenceComponentName")
        if base and base not in self.components:
            return 400, {"__type": "ValidationException", "message": f"base {base} does not exist"}
        now = time.time()
        self.components[name] = {
            "InferenceComponentName": name,
            "InferenceComponentArn": f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:inference-component/{name}",
            "EndpointName": params["EndpointName"],
            "EndpointArn": f"arn:aws:sagemaker:us-east-1:{ACCOUNT}:endpoint/{params['EndpointName']}",
            "VariantName": params.get("VariantName", "AllTraffic"),
            "Specification": params["Specification"],
            "RuntimeConfig": {"DesiredCopyCount": params.get("RuntimeConfig", {}).get("CopyCount", 1),
                              "CurrentCopyCount": params.get("RuntimeConfig", {}).get("CopyCount", 1)},
            "InferenceComponentStatus": "InService",
            "CreationTime": now,
            "LastModifiedTime": now,
        }  # fmt: skip
        if base and self.container:
            self._register(name)
        return 200, {"InferenceComponentArn": self.components[name]["InferenceComponentArn"]}

    def _describe_inference_component(self, params: dict) -> tuple[int, dict]:
        name = params["InferenceComponentName"]
        return (200, self.components[name]) if name in self.components else self._missing(name)

    def _list_inference_components(self, params: dict) -> tuple[int, dict]:
        keys = ("InferenceComponentName", "InferenceComponentArn", "EndpointName", "EndpointArn", "VariantName",
                "InferenceComponentStatus", "CreationTime", "LastModifiedTime")  # fmt: skip
        found = [{k: c[k] for k in keys} for c in self.components.values()
                 if c["EndpointName"] == params.get("EndpointNameEquals", c["EndpointName"])]  # fmt: skip
        return 200, {"InferenceComponents": found}

    def _update_inference_component(self, params: dict) -> tuple[int, dict]:
        name = params["InferenceComponentName"]
        if name not in self.components:
            return self._missing(name)
        self.components[name]["Specification"] = params["Specification"]
        self.components[name]["LastModifiedTime"] = time.time()
        return 200, {"InferenceComponentArn": self.components[name]["InferenceComponentArn"]}

    def _delete_inference_component(self, params: dict) -> tuple[int, dict]:
        name = params["InferenceComponentName"]
        if name not in self.components:
            return self._missing(name)
        if any(c["Specification"].get("BaseInferenceComponentName") == name for c in self.components.values()):
            return 400, {"__type": "ValidationException", "message": f"{name} still has adapter components"}
        removed = self.components.pop(name)
        if removed["Specification"].get("BaseInferenceComponentName") and self.container:
            request = urllib.request.Request(f"{self.container}/adapters/{name}", method="DELETE")
            with urllib.request.urlopen(request, timeout=120):
                pass
        return 200, {}

    def endpoint_config(self, params: dict) -> bytes:
        """moto refuses an endpoint config whose variant names no model (KeyError: 'ModelName', an HTTP 500), which
        is what an endpoint for inference components is: such a variant gets a placeholder model in moto."""
        try:
            assert_valid("sagemaker", "CreateEndpointConfig", params)
        except AssertionError as exc:
            self.problems.append(str(exc))
        for variant in params["ProductionVariants"]:
            if "ModelName" not in variant:
                if not self._placeholder:
                    self._sagemaker().create_model(ModelName=PLACEHOLDER, ExecutionRoleArn=params["ExecutionRoleArn"],
                                                   PrimaryContainer={"Image": "placeholder:1"})  # fmt: skip
                    self._placeholder = True
                variant["ModelName"] = PLACEHOLDER
        return json.dumps(params).encode()

    def _sagemaker(self):
        import boto3

        return boto3.client("sagemaker", region_name="us-east-1", endpoint_url=self.moto_url)

    # -- the base's container -------------------------------------------------------------------------------------

    def attach(self, container_url: str) -> None:
        """The base component's container serves: load every adapter component onto it, as SageMaker does."""
        self.container = container_url.rstrip("/")
        for name, component in self.components.items():
            if component["Specification"].get("BaseInferenceComponentName"):
                self._register(name)

    def _register(self, name: str) -> None:
        url = self.components[name]["Specification"]["Container"]["ArtifactUrl"]
        bucket, _, key = url.removeprefix("s3://").partition("/")
        target = Path(self._unpacked.name) / name
        archive = self.s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as unpacked:
            unpacked.extractall(target, filter="data")
        request = urllib.request.Request(f"{self.container}/adapters", method="POST",
                                         data=json.dumps({"name": name, "src": str(target)}).encode(),
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                self.registered[name] = (response.status, response.read().decode())
        except urllib.error.HTTPError as exc:
            self.registered[name] = (exc.code, exc.read().decode())
            self.components[name] |= {"InferenceComponentStatus": "Failed",
                                      "FailureReason": self.registered[name][1][:500]}  # fmt: skip

    def invoke(self, component: str, body: bytes) -> tuple[int, bytes]:
        if component not in self.components or not self.container:
            return 400, b'{"__type":"ValidationException","message":"Inference component not found"}'
        adapter = component if self.components[component]["Specification"].get("BaseInferenceComponentName") else ""
        self.invoked.append((component, adapter))
        headers = {"Content-Type": "application/json",
                   **({"X-Amzn-SageMaker-Adapter-Identifier": adapter} if adapter else {})}  # fmt: skip
        request = urllib.request.Request(self.container + "/invocations", data=body, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                return 200, response.read()
        except urllib.error.HTTPError as exc:
            return 424, json.dumps({"__type": "ModelError", "Message": exc.read().decode()[:500]}).encode()

    def __enter__(self) -> InferenceComponents:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._unpacked.cleanup()
