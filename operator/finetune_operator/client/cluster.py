"""`FineTuneClient`: submit, follow and manage FineTuneJobs from Python, typed with the API's models.

Why: data scientists drive training from notebooks and pipelines. This is the Kubernetes
backend (the shape of Kubeflow's `TrainerClient`): custom objects and watches through the
official `kubernetes` client, pod logs through the kubelet (the apiserver proxies them), and
every answer parsed into `FineTuneJob`. Errors are the typed ones of `client.errors`.

`logs(follow=True)` outlives a gang restart: a followed log ends when its container stops
(as a kubelet ends it); the client then waits for the rank's next pod (a new uid after a gang
restart) or the container's next run, and goes on until the job has finished.
"""

from __future__ import annotations

import builtins
import ipaddress
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import urllib3

from ..api import GROUP, PLURAL, VERSION, FineTuneJob
from .documents import Submittable, document_of
from .errors import (
    ApiError,
    JobExists,
    JobFailed,
    JobNotFound,
    JobRejected,
    MetricsUnavailable,
    ServingRefused,
    StateUnreachable,
    WaitTimeout,
)
from .views import (
    FINAL_STATES,
    JOB_NAME_LABEL,
    TRAINER_CONTAINER,
    container_started,
    memory_from_metrics,
    pod_index_of_rank,
    rank_pod,
    state_of,
)
from .views import apiserver_problems as _problems

ProgressCallback = Callable[[FineTuneJob], None]
WATCH_CHUNK_S = 60
"""A watch is re-opened at least this often, so a dropped connection costs at most this much."""


@dataclass(frozen=True)
class JobEvent:
    """One Kubernetes Event about a job (as `kubectl describe` lists them)."""

    type: str
    reason: str
    message: str
    count: int
    last_time: str


class FineTuneClient:
    """FineTuneJobs of one namespace (each call may name another).

    `FineTuneClient()` reads the kubeconfig ($KUBECONFIG, ~/.kube/config) and its context's
    namespace, or the in-cluster service account; `api_client=` takes a configured
    `kubernetes.client.ApiClient` instead.
    """

    def __init__(
        self,
        namespace: str | None = None,
        *,
        kubeconfig: str | Path | None = None,
        context: str | None = None,
        api_client: kubernetes.client.ApiClient | None = None,
        poll_seconds: float = 1.0,
    ) -> None:
        default_namespace = "default"
        if api_client is None:
            api_client, default_namespace = _connect(kubeconfig, context)
        self.api = api_client
        self.namespace = namespace or default_namespace
        self.poll_seconds = poll_seconds
        self._custom = kubernetes.client.CustomObjectsApi(api_client)
        self._core = kubernetes.client.CoreV1Api(api_client)

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]

    def __enter__(self) -> FineTuneClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the job object ----------------------------------------------------------------------
    def submit(
        self,
        job: Submittable,
        *,
        name: str | None = None,
        namespace: str | None = None,
    ) -> FineTuneJob:
        """Create the job from a model, a spec (with `name`), a manifest dict or a YAML file.
        Raises JobRejected (locally or by the apiserver, one line per field), JobExists."""
        document = document_of(job, name)
        ns = namespace or document["metadata"].get("namespace") or self.namespace
        document["metadata"]["namespace"] = ns
        document.pop("status", None)
        try:
            created = self._custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, document)
        except kubernetes.client.ApiException as exc:
            if exc.status == 409:
                raise JobExists(document["metadata"]["name"], ns) from None
            if exc.status in (400, 422):
                raise JobRejected(document["metadata"]["name"], _problems(exc.body)) from None
            raise _api_error(exc) from None
        return FineTuneJob.from_wire(created)

    def get(self, name: str, *, namespace: str | None = None) -> FineTuneJob:
        ns = namespace or self.namespace
        try:
            return FineTuneJob.from_wire(self._custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name))
        except kubernetes.client.ApiException as exc:
            raise _not_found(exc, name, ns) from None

    def list(self, selector: str | None = None, *, namespace: str | None = None) -> builtins.list[FineTuneJob]:
        """Jobs of the namespace, optionally by label selector (`team=nlp,tier!=dev`), by name."""
        ns = namespace or self.namespace
        try:
            answer: dict[str, Any] = self._custom.list_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, label_selector=selector or ""
            )  # type: ignore[assignment]
        except kubernetes.client.ApiException as exc:
            raise _api_error(exc) from None
        return sorted((FineTuneJob.from_wire(item) for item in answer.get("items", [])), key=lambda j: j.name)

    def suspend(self, name: str, *, namespace: str | None = None) -> FineTuneJob:
        """Scale the job's workers to 0 (it resumes from its checkpoint)."""
        return self._patch_spec(name, namespace, {"suspend": True})

    def resume(self, name: str, *, namespace: str | None = None) -> FineTuneJob:
        return self._patch_spec(name, namespace, {"suspend": False})

    def serve(
        self,
        name: str,
        target: str = "InferenceService",
        *,
        namespace: str | None = None,
        timeout: float | None = None,
        **settings: Any,
    ) -> FineTuneJob:
        """Serve the job's result: set `spec.serving` (`target` and any of its fields, camelCase or
        snake_case: model, baseModelUri, maxLoraRank, ...); the operator applies it once the job
        succeeded. With `timeout`, wait until `status.serving` names what serves it (WaitTimeout
        otherwise); a target that cannot serve it raises ServingRefused with the condition's message."""
        ns = namespace or self.namespace
        serving = {"target": target, **{_camel(key): value for key, value in settings.items()}}
        job = self._patch_spec(name, ns, {"serving": serving})
        if timeout is None:
            return job
        deadline = time.monotonic() + timeout
        while True:
            status = job.status
            condition = next((c for c in status.conditions if c.type == "Serving"), None) if status else None
            served = status is not None and status.serving is not None
            if served and condition is not None and condition.status == "True":
                return job
            if condition is not None and condition.status == "False" and condition.reason == "ServingRefused":
                raise ServingRefused(name, condition.message)
            if time.monotonic() >= deadline:
                raise WaitTimeout(name, ("served",), timeout, job)
            time.sleep(self.poll_seconds)
            job = self.get(name, namespace=ns)

    def delete(self, name: str, *, namespace: str | None = None, wait: bool = False, timeout: float = 120) -> None:
        """Delete the job (its children go with it; never its output volume). With `wait`,
        return once the object is gone (WaitTimeout otherwise)."""
        ns = namespace or self.namespace
        try:
            self._custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        except kubernetes.client.ApiException as exc:
            raise _not_found(exc, name, ns) from None
        deadline = time.monotonic() + timeout
        while wait:
            try:
                last = self.get(name, namespace=ns)
            except JobNotFound:
                return
            if time.monotonic() >= deadline:
                raise WaitTimeout(name, ("deleted",), timeout, last)
            time.sleep(self.poll_seconds)

    def events(self, name: str, *, namespace: str | None = None) -> builtins.list[JobEvent]:
        """The job's Events, oldest first."""
        ns = namespace or self.namespace
        try:
            answer = self._core.list_namespaced_event(
                ns, field_selector=f"involvedObject.name={name},involvedObject.kind=FineTuneJob"
            )
        except kubernetes.client.ApiException as exc:
            raise _api_error(exc) from None
        events = [
            JobEvent(
                type=e.type or "",
                reason=e.reason or "",
                message=e.message or "",
                count=e.count or 1,
                last_time=_time(e.last_timestamp or e.event_time or e.metadata.creation_timestamp),
            )
            for e in answer.items
        ]
        return sorted(events, key=lambda e: e.last_time)

    # -- waiting -----------------------------------------------------------------------------
    def wait(
        self,
        name: str,
        until: str | tuple[str, ...] = "Succeeded",
        *,
        timeout: float | None = None,
        on_progress: ProgressCallback | None = None,
        namespace: str | None = None,
    ) -> FineTuneJob:
        """Block until the job's state is one of `until` and return it. `on_progress(job)` is
        called with every change seen. Raises WaitTimeout, JobFailed (Failed while waiting for
        another state), StateUnreachable (Succeeded while waiting for another), JobNotFound."""
        wanted = (until,) if isinstance(until, str) else tuple(until)
        ns = namespace or self.namespace
        deadline = None if timeout is None else time.monotonic() + timeout
        job = self.get(name, namespace=ns)
        while True:
            if on_progress is not None:
                on_progress(job)
            state = state_of(job)
            if state in wanted:
                return job
            if state == "Failed":
                raise JobFailed(job)
            if state == "Succeeded":
                raise StateUnreachable(job, wanted)
            remaining = WATCH_CHUNK_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(name, wanted, timeout or 0.0, job)
            job = self._next_version(job, ns, min(remaining, WATCH_CHUNK_S))

    def _next_version(self, job: FineTuneJob, ns: str, seconds: float) -> FineTuneJob:
        """The job's next version through a watch from its resourceVersion, or `job` after `seconds`."""
        watch = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]
        try:
            for event in watch.stream(  # type: ignore[no-untyped-call]
                self._custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                ns,
                PLURAL,
                field_selector=f"metadata.name={job.name}",
                resource_version=job.metadata.resource_version,
                timeout_seconds=max(1, int(seconds)),
                _request_timeout=seconds + 10,
            ):
                if event["type"] == "DELETED":
                    raise JobNotFound(job.name, ns)
                if event["type"] in ("ADDED", "MODIFIED"):
                    return FineTuneJob.from_wire(event["object"])
        except kubernetes.client.ApiException as exc:
            if exc.status != 410:  # Gone: the version is too old; a fresh read follows
                raise _api_error(exc) from None
        finally:
            watch.stop()  # type: ignore[no-untyped-call]
        return self.get(job.name, namespace=ns)

    # -- logs --------------------------------------------------------------------------------
    def logs(
        self,
        name: str,
        rank: int = 0,
        follow: bool = True,
        *,
        namespace: str | None = None,
        tail_lines: int | None = None,
    ) -> Iterator[str]:
        """Lines (without newline) of the trainer container that runs global rank `rank`.

        Without `follow`: what its current pod has logged so far. With `follow`: on across
        gang restarts (the rank's next pod) until the job has finished."""
        ns = namespace or self.namespace
        job = self.get(name, namespace=ns)
        index = pod_index_of_rank(job, rank)
        followed: tuple[str, int] | None = None  # (pod uid, restart count) of the last stream
        while True:
            pod = self._rank_pod(name, ns, index)
            run = (pod["metadata"]["uid"], _restarts(pod)) if pod is not None and container_started(pod) else None
            if run is not None and run != followed:
                assert pod is not None
                yield from self._stream(pod["metadata"]["name"], ns, follow, tail_lines)
                if not follow:
                    return
                followed, tail_lines = run, None
                continue
            if not follow:
                return  # no pod of that rank has started yet
            if state_of(self.get(name, namespace=ns)) in FINAL_STATES:
                return
            time.sleep(self.poll_seconds)

    def _rank_pod(self, name: str, ns: str, index: int) -> dict[str, Any] | None:
        try:
            answer = self._core.list_namespaced_pod(ns, label_selector=f"{JOB_NAME_LABEL}={name}")
        except kubernetes.client.ApiException as exc:
            raise _api_error(exc) from None
        pods = [self.api.sanitize_for_serialization(p) for p in answer.items]  # type: ignore[no-untyped-call]
        return rank_pod(pods, index)

    def _stream(self, pod: str, ns: str, follow: bool, tail_lines: int | None) -> Iterator[str]:
        extra: dict[str, Any] = {"tail_lines": tail_lines} if tail_lines is not None else {}
        try:
            response: Any = self._core.read_namespaced_pod_log(
                pod, ns, container=TRAINER_CONTAINER, follow=follow, _preload_content=False, **extra
            )
        except kubernetes.client.ApiException as exc:
            if exc.status in (400, 404):  # the pod went away or its container is not running yet
                return
            raise _api_error(exc) from None
        pending = b""
        try:
            for chunk in response.stream(8192, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    yield line.decode("utf-8", errors="replace")
            if pending:
                yield pending.decode("utf-8", errors="replace")
        finally:
            response.release_conn()
            response.close()

    # -- measured memory ---------------------------------------------------------------------
    def measured_memory(self, name: str, *, namespace: str | None = None) -> dict[str, float]:
        """Rank 0's model-state bytes by component (weights, gradients, optimizer_states, and
        `resident`: the process's RSS; `gpu_peak` on GPU) from its /metrics. Raises
        MetricsUnavailable (with the reason) when there is no rank 0 or it does not answer.

        Read through the apiserver's pod proxy; a pod on a loopback IP (the apiserver never
        proxies to those: a process node's pods on this machine) is asked directly."""
        ns = namespace or self.namespace
        pod = self._rank_pod(name, ns, 0)
        if pod is None:
            raise MetricsUnavailable("no pod of rank 0")
        port = next(
            (p.get("containerPort") for c in pod["spec"]["containers"] for p in c.get("ports") or []
             if p.get("name") == "metrics-0"),
            None,
        )  # fmt: skip
        if port is None:
            raise MetricsUnavailable(f"pod {pod['metadata']['name']} has no port named metrics-0")
        try:
            text = self._core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod['metadata']['name']}:{port}", ns, "metrics", _request_timeout=5
            )
        except (kubernetes.client.ApiException, OSError, urllib3.exceptions.HTTPError) as exc:
            ip = (pod.get("status") or {}).get("podIP")
            if not (ip and ipaddress.ip_address(ip).is_loopback):
                raise MetricsUnavailable(f"the apiserver's proxy to {pod['metadata']['name']}:{port}: {exc}") from None
            try:
                with urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=5) as answer:
                    text = answer.read().decode()
            except OSError as direct:
                raise MetricsUnavailable(f"http://{ip}:{port}/metrics: {direct}") from None
        return memory_from_metrics(str(text))

    # -- helpers -----------------------------------------------------------------------------
    def _patch_spec(self, name: str, namespace: str | None, spec: dict[str, Any]) -> FineTuneJob:
        ns = namespace or self.namespace
        try:
            patched = self._custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": spec})
        except kubernetes.client.ApiException as exc:
            if exc.status == 422:
                raise JobRejected(name, _problems(exc.body)) from None
            raise _not_found(exc, name, ns) from None
        return FineTuneJob.from_wire(patched)


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _connect(kubeconfig: str | Path | None, context: str | None) -> tuple[kubernetes.client.ApiClient, str]:
    """A client and the namespace of the chosen context. $KUBECONFIG is read now, not when
    `kubernetes` was imported (it reads it then): a notebook may set it after its imports."""
    path = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if kubeconfig is None and not os.environ.get("KUBECONFIG") and not Path(path).exists():
        if not os.environ.get("KUBERNETES_SERVICE_HOST"):
            raise ApiError(0, "NoConfiguration", f"no kubeconfig ({path}, $KUBECONFIG) and not inside a cluster")
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
        service_account = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
        return kubernetes.client.ApiClient(), service_account.read_text().strip() or "default"
    contexts, active = kubernetes.config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    client = kubernetes.config.new_client_from_config(config_file=path, context=context)  # type: ignore[no-untyped-call]
    chosen = next((c for c in contexts if c["name"] == context), active) if context is not None else active
    return client, (chosen.get("context") or {}).get("namespace") or "default"


def _restarts(pod: dict[str, Any]) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount") or 0) for s in statuses if s.get("name") == TRAINER_CONTAINER)


def _time(value: Any) -> str:
    return value.strftime("%Y-%m-%dT%H:%M:%SZ") if hasattr(value, "strftime") else str(value or "")


def _api_error(exc: kubernetes.client.ApiException) -> ApiError:
    problems = _problems(exc.body)
    return ApiError(int(exc.status or 0), str(exc.reason or ""), "; ".join(problems))


def _not_found(exc: kubernetes.client.ApiException, name: str, ns: str) -> Exception:
    return JobNotFound(name, ns) if exc.status == 404 else _api_error(exc)
