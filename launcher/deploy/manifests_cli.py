"""`launcher exporters manifests`: the exporter's Kubernetes deployment (launcher/deploy/manifests.py) as
YAML, one file per object, or a kustomize base with overlays (docs/kubernetes.md). The flags are the
Options fields, spelled as dcgm-exporter's chart values and kubectl taints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from exporter import outputflag, profiles, userinput
from exporter.outputflag import format_option
from launcher.exitcodes import ExitCode
from launcher.failing import fail

FORMATS = ("yaml", "json")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _toleration(spec: str) -> dict[str, str]:
    """kubectl taint's KEY[=VALUE][:EFFECT] as a toleration of it; `*` tolerates every taint."""
    if spec == "*":
        return {"operator": "Exists"}
    taint, _, effect = spec.partition(":")
    key, sep, value = taint.partition("=")
    if not key or (effect and effect not in _TAINT_EFFECTS):
        raise click.BadParameter(f"{spec!r} is not KEY[=VALUE][:EFFECT] (EFFECT one of {', '.join(_TAINT_EFFECTS)}) "
                                 "or '*'", param_hint="--toleration")
    toleration = {"key": key, "operator": "Equal", "value": value} if sep else {"key": key, "operator": "Exists"}
    return toleration | ({"effect": effect} if effect else {})


def _pairs(items: tuple[str, ...], hint: str) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint=hint)
        pairs[key] = value
    return pairs


def _affinity(text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        value = userinput.load_yaml(userinput.read_text(Path(text[1:])) if text.startswith("@") else text)
    except userinput.InputError as exc:
        raise click.BadParameter(f"{text if text.startswith('@') else 'the mapping'}: {exc.problem}",
                                 param_hint="--affinity") from None
    if not isinstance(value, dict):
        raise click.BadParameter("give a YAML or JSON mapping (the pod's `affinity`), or @FILE holding one",
                                 param_hint="--affinity")
    return value


@click.command()
@click.option("--namespace", help="Namespace of every object [default: monitoring].")
@click.option("--release", metavar="NAME",
              help="kube-prometheus-stack's Helm release: every object gets the label release=NAME it selects.")
@click.option("--name", help="Name of the DaemonSet and Service; the other objects' names start with it "
                             "[default: raypulse-exporter].")
@click.option("--image", metavar="IMAGE", help="Exporter image [default: ghcr.io/raypulse/raypulse-exporter:VERSION].")
@click.option("--cluster", help="Value of the cluster label of every series [default: default].")
@click.option("--cluster-label", help="Name of the cluster label (the label contract, exporter/contract/labels.py), "
                                    "e.g. ray_io_cluster as KubeRay names it [default: cluster].")
@click.option("--node-label", help="Name of the node label [default: node].")
@click.option("--scrape-job", help="The job label of the exporters' series, which the alert rules select "
                                   "[default: raypulse].")
@click.option("--runbook-base", metavar="URL", help="Where the alerts' runbook links point [default: the project's].")
@click.option("--profile", type=click.Choice(profiles.NAMES),
              help=f"The exporter's collector profile [default: {profiles.DEFAULT}]; {profiles.COMPANION} where "
                   "node_exporter runs on the nodes too.")
@click.option("--web-config-secret", metavar="SECRET",
              help="A Secret with web-config.yml (TLS, basic auth) and the files it names: HTTPS, probes and "
                   "scrape included; the scrape trusts its ca.crt.")
@click.option("--runtime-class", metavar="NAME",
              help="runtimeClassName of the pods, e.g. nvidia where the NVIDIA runtime is not the default one.")
@click.option("--priority-class", metavar="NAME",
              help="priorityClassName of the pods, '' for none [default: system-node-critical].")
@click.option("--node-selector", "node_selector", multiple=True, metavar="KEY=VALUE",
              help="Run only on nodes with this label (repeatable).")
@click.option("--toleration", "tolerations", multiple=True, metavar="KEY[=VALUE][:EFFECT]|*",
              help="Tolerate this taint, '*' every taint (repeatable; replaces the default, "
                   "nvidia.com/gpu:NoSchedule).")
@click.option("--affinity", metavar="YAML|@FILE", help="The pods' affinity, a YAML or JSON mapping.")
@click.option("--image-pull-secret", "image_pull_secrets", multiple=True, metavar="SECRET",
              help="imagePullSecrets of the pods (repeatable).")
@click.option("--arg", "extra_args", multiple=True, metavar="ARG",
              help="One more argument of `exporter serve` (repeatable; after the generated ones).")
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="One more environment variable (repeatable).")
@click.option("--unprivileged", is_flag=True,
              help="Run as the image's user without capabilities: other users' processes are not attributed.")
@click.option("--pod-network", is_flag=True, help="Use the pod's network namespace instead of the node's.")
@click.option("--cut", is_flag=True, default=None,
              help="Large clusters: the scrape drops the families no alert needs and no panel depends on "
                   "(per-link NVLink; docs/scale.md).")
@click.option("--watchdog", is_flag=True, default=None,
              help="Add RaypulseWatchdog to the PrometheusRule (for an Alertmanager other than "
                   "kube-prometheus-stack's, which has its own Watchdog).")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Write one YAML file per object into this directory instead of all to stdout.")
@format_option(FORMATS, legacy_path=True)
@click.option("--kustomize", "kustomize_dir", type=click.Path(file_okay=False, path_type=Path), metavar="DIR",
              help="Write a kustomize base and overlays (kube-prometheus-stack, plain) into DIR instead "
                   "(exporter/kustomize/ is this with the defaults).")
def manifests(node_selector: tuple[str, ...], tolerations: tuple[str, ...], affinity: str | None,
              image_pull_secrets: tuple[str, ...], extra_args: tuple[str, ...], env: tuple[str, ...],
              unprivileged: bool, pod_network: bool, directory: Path | None, output: str,
              kustomize_dir: Path | None, priority_class: str | None, **given: str | None) -> None:
    """Kubernetes manifests: ServiceAccount, DaemonSet, Service, ServiceMonitor, PrometheusRule, dashboard
    ConfigMaps (docs/kubernetes.md). -o json: one v1 List on stdout (with --dir or --kustomize: what was
    written, as JSON)."""
    from launcher.deploy import manifests as k8s  # the renderer and its templates: for this command only

    output, directory = outputflag.resolve_dir("launcher", output, directory, FORMATS)
    if directory is not None and kustomize_dir is not None:
        raise click.UsageError("give --dir or --kustomize, not both")
    settings: dict[str, Any] = {key: value for key, value in given.items() if value is not None}
    if priority_class is not None:
        settings["priority_class"] = priority_class or None
    if tolerations:
        settings["tolerations"] = tuple(_toleration(spec) for spec in tolerations)
    try:
        options = k8s.Options(**settings, node_selector=_pairs(node_selector, "--node-selector"),
                              affinity=_affinity(affinity), image_pull_secrets=image_pull_secrets,
                              extra_args=extra_args, env=_pairs(env, "--env"), unprivileged=unprivileged,
                              host_network=not pod_network)
    except ValueError as exc:
        fail("exporters.manifests", exc, ExitCode.BAD_INPUT)
    written = "json" if output == "json" else "text"  # with --dir or --kustomize: the paths written
    if kustomize_dir is not None:
        outputflag.echo_wrote(k8s.write_kustomize(k8s.kustomize(options), kustomize_dir), written)
        return
    objects = k8s.render(options)
    if directory is not None:
        outputflag.echo_wrote(k8s.write(objects, directory), written)
    elif output == "json":
        click.echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2))
    else:
        click.echo(k8s.to_yaml(objects), nl=False)
