"""Kueue on the local cluster: its CRDs, its webhooks and its controller as a local process.

Why this way: Kueue's own internal certificate management runs unchanged (it writes its serving
cert and injects its CA into the webhook configurations and the CRDs' conversion webhooks, as in
a real install). The apiserver reaches a webhook Service through the Service's ClusterIP (without
`--enable-aggregator-routing` it resolves Services to their ClusterIP), and this cluster's
service range is loopback (127.3.0.0/24): so the webhook Service gets no selector, and Kueue's
webhook server binds that ClusterIP and the Service's port itself. Nothing leaves loopback. No
kubelet mounts the cert Secret into Kueue's cert dir here, so `mount_certs` copies it there.

The other way, `--enable-aggregator-routing` with a selector-less Service and an EndpointSlice
at 127.0.0.1, does not work: the apiserver refuses loopback endpoint addresses ("may not be in
the loopback range"). Giving Kueue certs from the cluster's own PKI instead needs internal cert
management off, and then Kueue reads its metrics cert from the fixed path
/etc/kueue/metrics/certs, which a test must not write.

Only Kueue's own webhooks (kueue.x-k8s.io objects) are registered: the job-framework webhooks
(batch Jobs, Pods, ...) would intercept every pod of the cluster for integrations not enabled.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import yaml

from finetune_localcluster.binaries import Binaries
from finetune_localcluster.kube import Kube, KubeError, Obj

NAMESPACE = "kueue-system"
SERVICE = "kueue-webhook-service"
SECRET = "kueue-webhook-server-cert"
CONVERTED = ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
"""CRDs whose conversion webhook Kueue's cert management injects its CA into (it waits for them)."""
EXTERNAL_FRAMEWORKS = ("FineTuneJob.v1alpha1.finetune.dev",)
OWN_WEBHOOK_PATH = "-kueue-x-k8s-io-"
CERT_FILES = ("ca.crt", "tls.crt", "tls.key")


def webhook_service(port: int) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        "spec": {"ports": [{"name": "webhook", "port": port, "targetPort": port, "protocol": "TCP"}]},
    }


def crds(bins: Binaries, port: int) -> list[Obj]:
    """Kueue's CRDs, with the conversion webhook a real install adds to some of them."""
    out = []
    for path in sorted(bins.kueue_crds.glob("*.yaml")):
        crd: Obj = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["plural"] in CONVERTED:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {
                        "service": {"name": SERVICE, "namespace": NAMESPACE, "path": "/convert", "port": port}
                    },
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def webhook_configurations(bins: Binaries, port: int) -> list[Obj]:
    """Kueue's mutating and validating webhook configurations, for its own objects only, named as
    its cert management expects (`kueue-{mutating,validating}-webhook-configuration`)."""
    out = []
    for doc in yaml.safe_load_all(bins.kueue_webhooks.read_text()):
        if not doc:
            continue
        config = copy.deepcopy(doc)
        kind = "mutating" if config["kind"] == "MutatingWebhookConfiguration" else "validating"
        config["metadata"] = {"name": f"kueue-{kind}-webhook-configuration"}
        hooks = []
        for hook in config.get("webhooks", []):
            service = hook["clientConfig"]["service"]
            if OWN_WEBHOOK_PATH not in service["path"]:
                continue
            hook["clientConfig"]["service"] = {**service, "name": SERVICE, "namespace": NAMESPACE, "port": port}
            hooks.append(hook)
        config["webhooks"] = hooks
        out.append(config)
    return out


def configuration(
    host: str, port: int, workdir: Path, *, health_port: int, metrics_port: int, visibility_port: int
) -> Obj:
    """A Kueue Configuration that enables only what the operator needs, on loopback."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"host": host, "port": port, "certDir": str(workdir / "certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": True, "webhookServiceName": SERVICE, "webhookSecretName": SECRET},
        "visibilityServer": {"bindAddress": "127.0.0.1", "bindPort": visibility_port},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": [], "externalFrameworks": list(EXTERNAL_FRAMEWORKS)},
    }


def install(kube: Kube, bins: Binaries, port: int) -> str:
    """Namespace, webhook Service, CRDs and webhook configurations; returns the Service's ClusterIP."""
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    service = kube.create(f"/api/v1/namespaces/{NAMESPACE}/services", webhook_service(port))
    # the cert rotator fills this Secret in (a real install ships it empty, too)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE}}
    kube.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", secret)
    for crd in crds(bins, port):
        kube.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    for config in webhook_configurations(bins, port):
        plural = (
            "mutatingwebhookconfigurations"
            if config["kind"].startswith("Mutating")
            else "validatingwebhookconfigurations"
        )
        kube.create(f"/apis/admissionregistration.k8s.io/v1/{plural}", config)
    return str(service["spec"]["clusterIP"])


def mount_certs(kube: Kube, cert_dir: Path) -> bool:
    """Play the kubelet's secret volume: copy the certs Kueue's rotator wrote into its Secret to
    the webhook cert dir (the rotator waits for them there). False while the Secret is empty."""
    data = (kube.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{SECRET}").get("data")) or {}
    if not all(key in data for key in CERT_FILES):
        return False
    cert_dir.mkdir(parents=True, exist_ok=True)
    for key in CERT_FILES:
        path = cert_dir / key
        path.write_bytes(base64.b64decode(data[key]))
        path.chmod(0o600)
    return True


def admits_objects(kube: Kube) -> bool:
    """Kueue's webhooks answer: a server-side dry run of a ResourceFlavor goes through them."""
    flavor: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ResourceFlavor",
        "metadata": {"name": "ftjob-probe"},
    }
    try:
        kube.request("POST", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors", body=flavor, params={"dryRun": "All"})
    except KubeError:
        return False
    return True
