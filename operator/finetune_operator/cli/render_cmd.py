"""`ftjob render FILE`: print every manifest the operator would apply, like `helm template`."""

from __future__ import annotations

import argparse
import sys

import yaml

from ..plan import PlanningError, choose_plan
from ..render.manifests import render_all
from ..render.options import DEFAULT_TRAINER_IMAGE, RenderOptions
from ..render.serving.choice import Refused
from ..render.serving.objects import render_serving
from .manifests import load_one


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the config files) as readable literal blocks."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _str)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="a FineTuneJob manifest")
    parser.add_argument("--image", default=DEFAULT_TRAINER_IMAGE, help="default trainer image")
    parser.add_argument("--pod-monitor", action="store_true", help="also render a PodMonitor")


def run(args: argparse.Namespace) -> int:
    job = load_one(args.file)
    if job.metadata.namespace is None:
        job = job.model_copy(update={"metadata": job.metadata.model_copy(update={"namespace": "default"})})
    try:
        plan = choose_plan(job.spec)
    except PlanningError as exc:
        print(f"{args.file}: {job.name}: {exc.condition_reason}: {exc}", file=sys.stderr)
        return 2
    options = RenderOptions(trainer_image=args.image, pod_monitor=args.pod_monitor)
    objects = render_all(job, plan, options, replicas=job.spec.resources.num_nodes)
    print(yaml.dump_all(objects, Dumper=_BlockDumper, sort_keys=False, width=120), end="")
    if job.spec.serving is not None:  # applied after success, from the URIs the run will report
        served = render_serving(job)
        if isinstance(served, Refused):
            print(f"{args.file}: {job.name}: serving: {served}", file=sys.stderr)
            return 2
        print("---\n# spec.serving: applied once the job succeeded (not owned by the job)")
        print(yaml.dump_all(served.objects, Dumper=_BlockDumper, sort_keys=False, width=120), end="")
    return 0
