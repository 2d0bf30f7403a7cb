"""The launcher at cluster scale (issue 26): its health watcher and run recorder against a fake fleet of
node exporters, at 10 / 100 / 500 / 2,000 nodes, today's code beside a baseline checkout.

The fleet (`fleet`, one process of its own) serves N exporters on N loopback addresses (127.1.x.y, one
port), each with a real 8-GPU node's /metrics: the bodies are taken once from a real `exporter serve
--simulate-gpus 8` with eight ranks reporting progress (`capture`), one of them again after
`exporter gpu-fault ... xid 79` (the body a faulty node serves). The fleet answers `name[]` selections
and If-None-Match as the exporter does, with its own code (exporter.serving.exposition.Rendering: the same
gzip and ETag; exporter.serving.server.not_modified: the same 304 rule); it also serves /sd. POST /fake/tick
makes every node's training progress advance (a new step: new bytes and ETag for the families holding it).
Each node also serves its health digest (wire.DIGEST_PATH), made from its body by the exporter's own
reduction (exporter/contract/digest.py build), with the exporter's ETag and 304 rule; POST
/fake/fault?node=I gives node I the faulty body from then on (bench/fleet_watch.py).

The launcher's code runs in a process of its own per size and checkout (`measure`), so its CPU and peak
RSS are its own: a health check cold (the first), steady (nothing changed: 304s), and training (every node
advanced a step: 200s); then a recorder round the same three ways. The only stand-ins are the ones a
cluster of that size on one machine needs: N exporters are one process serving N copies of real bytes.

    python -m bench.scale --section launcher [--sizes 10,100,500,2000] [--baseline DIR]
    python -m bench.scale_launcher [--sizes ...] [--baseline DIR]          # the same, alone
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SIZES = (10, 100, 500, 2000)
GPUS = 8
RANKS = 8
FAULT_GPU = 3
MEASURE_DEADLINE_S = 60.0
BASELINE_SKIP_ROUNDS_ABOVE = 500  # the baseline's recorder round at 2,000 nodes takes minutes: one round only


def _address(index: int) -> str:
    """Node i's loopback address: 127.1.0.1, 127.1.0.2, ... (250 per /24)."""
    return f"127.1.{index // 250}.{index % 250 + 1}"


def _get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read()


def _post(url: str, data: dict[str, Any] | None = None, timeout: float = 10) -> bytes:
    request = urllib.request.Request(url, data=json.dumps(data or {}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.read()


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out after {timeout:.0f}s waiting for {what}")


# --- the bodies, from a real exporter ---------------------------------------------------------------------


def capture(directory: Path) -> tuple[Path, Path, float]:
    """A real 8-GPU exporter's /metrics with RANKS ranks training (healthy.prom), and after an XID 79 on
    one GPU (xid.prom); returns their paths and when the capture began (faults after it are new)."""
    from exporter.contract import wire
    from scripts.ports import free_port

    began = time.time()
    port, progress = free_port(), free_port()
    control = directory / "gpus.json"
    process = subprocess.Popen([sys.executable, "-m", "exporter", "serve", "--listen", f"127.0.0.1:{port}",
                                "--simulate-gpus", str(GPUS), "--gpu-control", str(control), "--progress-listen",
                                f"127.0.0.1:{progress}", "--log-level", "warning"], cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: _get(base + "/readyz", 2) is not None, 60, "the capture exporter")
        reports = [{"kind": "progress", "submission_id": "scale-a1", "rank": rank, "time": time.time(), "step": 100,
                    "loss": 0.5, "samples_total": 6400, "learning_rate": 0.001} for rank in range(RANKS)]
        _post(f"http://127.0.0.1:{progress}{wire.PROGRESS_PATH}", {"reports": reports})
        _wait(lambda: b"raypulse_train_step{" in _get(base + "/metrics"), 30, "the ranks' steps on /metrics")
        healthy = directory / "healthy.prom"
        healthy.write_bytes(_get(base + "/metrics"))
        subprocess.run([sys.executable, "-m", "exporter", "gpu-fault", "--control", str(control), "--gpu",
                        str(FAULT_GPU), "xid", "79"], cwd=REPO, check=True, capture_output=True)
        _wait(lambda: b'xid="79"' in _get(base + "/metrics"), 30, "the XID 79 on /metrics")
        faulty = directory / "xid.prom"
        faulty.write_bytes(_get(base + "/metrics"))
    finally:
        process.terminate()
        process.wait(10)
    return healthy, faulty, began


# --- the fleet ------------------------------------------------------------------------------------------


def _families(body: str) -> dict[str, str]:
    """The body's text per family, by the name its samples carry (each family's block opens with HELP)."""
    blocks: dict[str, str] = {}
    name, lines = None, []
    for line in body.splitlines(keepends=True):
        if line.startswith("# HELP "):
            if name is not None:
                blocks[name] = "".join(lines)
            name, lines = line.split(" ", 3)[2], []
        lines.append(line)
    if name is not None:
        blocks[name] = "".join(lines)
    return blocks


ADVANCING = ("raypulse_train_step", "raypulse_train_last_progress_time_seconds")


def _advanced(block: str, generation: int) -> str:
    """A training family's block a few steps on: every sample's value plus `generation`."""
    if not generation:
        return block
    out = []
    for line in block.splitlines(keepends=True):
        if not line.startswith("#"):
            series, value = line.rstrip("\n").rsplit(" ", 1)
            line = f"{series} {float(value) + generation}\n"
        out.append(line)
    return "".join(out)


def serve_fleet(nodes: int, healthy: Path, faulty: Path, fault_nodes: list[int], port: int) -> None:
    """Serve `nodes` exporters on 127.1.x.y:`port` and /sd on 127.1.0.1:`port`/sd until SIGTERM (one listener
    on every address of `port`, answering only this machine)."""
    import asyncio
    import hashlib

    from aiohttp import web

    from exporter.contract import digest, wire
    from exporter.serving.exposition import Format, Rendering
    from exporter.serving.server import not_modified
    from launcher.health.exporters import parse

    bodies = {"healthy": _families(healthy.read_text()), "faulty": _families(faulty.read_text())}
    faults = set(fault_nodes)
    state = {"generation": 0, "requests": 0, "not_modified": 0, "digests": 0}
    cache: dict[tuple[str, int, frozenset[str] | None], Rendering] = {}
    digests: dict[tuple[str, int], tuple[bytes, str]] = {}
    by_address = {_address(index): index for index in range(nodes)}

    def node_digest(kind: str) -> tuple[bytes, str]:
        """The node's digest as its exporter makes it (exporter/contract/digest.py) from the same body."""
        key = (kind, state["generation"])
        found = digests.get(key)
        if found is None:
            body = rendering(kind, None).body.decode()
            made = digest.build((sample.name, sample.labels, sample.value) for sample in parse(body))
            text = digest.encode(made)
            found = digests[key] = (text, hashlib.blake2b(text, digest_size=12).hexdigest())
        return found

    async def node_digest_of(request: web.Request) -> web.Response:
        state["digests"] += 1
        host = request.transport.get_extra_info("sockname")[0] if request.transport else ""
        body, etag = node_digest("faulty" if by_address.get(host) in faults else "healthy")
        headers = {"ETag": f'"{etag}"'}
        if not_modified(request.if_none_match, etag):
            state["not_modified"] += 1
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, content_type="application/json", headers=headers)

    async def fault(request: web.Request) -> web.Response:
        faults.add(int(request.query["node"]))  # an XID 79 on that node from now on
        return web.json_response(state)

    def rendering(kind: str, names: frozenset[str] | None) -> Rendering:
        key = (kind, state["generation"], names)
        found = cache.get(key)
        if found is None:
            blocks = bodies[kind]
            chosen = sorted(blocks) if names is None else sorted(name for name in names if name in blocks)
            found = cache[key] = Rendering.of(Format.TEXT, [_advanced(blocks[name], state["generation"]).encode()
                                                            if name in ADVANCING else blocks[name].encode()
                                                            for name in chosen], joined=names is not None)
        return found

    async def metrics(request: web.Request) -> web.Response:
        state["requests"] += 1
        host = request.transport.get_extra_info("sockname")[0] if request.transport else ""
        kind = "faulty" if by_address.get(host) in faults else "healthy"
        asked = request.query.getall("name[]", [])
        if len(asked) > 64:
            return web.Response(status=400)
        chosen = rendering(kind, frozenset(asked) if asked else None)
        gzipped = "gzip" in request.headers.get("Accept-Encoding", "")
        etag = chosen.etag(gzipped)
        headers = {"Vary": "Accept, Accept-Encoding", "ETag": f'"{etag}"',
                   "Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        if not_modified(request.if_none_match, etag):
            state["not_modified"] += 1
            return web.Response(status=304, headers=headers)
        if gzipped:
            headers["Content-Encoding"] = "gzip"
            return web.Response(body=chosen.gzipped, headers=headers)
        return web.Response(body=chosen.body, headers=headers)

    async def sd(_: web.Request) -> web.Response:
        groups = [{"targets": [f"{_address(index)}:{port}"], "labels": {"node": f"node-{index}", "cluster": "scale",
                                                                       "role": "worker"}} for index in range(nodes)]
        return web.json_response(groups)

    async def tick(request: web.Request) -> web.Response:
        # ?generation=N: N steps (and seconds) past the captured body; else one more
        state["generation"] = int(request.query.get("generation", state["generation"] + 1))
        cache.clear()
        digests.clear()
        return web.json_response(state)

    async def counts(_: web.Request) -> web.Response:
        return web.json_response(state)

    @web.middleware
    async def loopback_only(request: web.Request, handler: Any) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if not peer or not str(peer[0]).startswith("127."):
            return web.Response(status=403)  # it listens on every address: only this machine may ask
        return await handler(request)

    async def main() -> None:
        app = web.Application(middlewares=[loopback_only])
        app.router.add_get("/metrics", metrics)
        app.router.add_get("/sd", sd)
        app.router.add_get(wire.DIGEST_PATH, node_digest_of)
        app.router.add_post("/fake/tick", tick)
        app.router.add_post("/fake/fault", fault)
        app.router.add_get("/fake/counts", counts)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        # One listener for every node (a node is the address a connection came to): N listeners and the
        # head's N kept connections would not fit one process's file descriptors at 10,000 nodes.
        await web.TCPSite(runner, "0.0.0.0", port, backlog=4096).start()
        print(json.dumps({"sd": f"http://{_address(0)}:{port}/sd", "control": f"http://{_address(0)}:{port}"}),
              flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await runner.cleanup()

    asyncio.run(main())


@dataclass
class Fleet:
    process: subprocess.Popen
    sd: str
    control: str

    def tick(self) -> None:
        _post(self.control + "/fake/tick")

    def counts(self) -> dict[str, int]:
        return json.loads(_get(self.control + "/fake/counts"))


@contextmanager
def fleet(nodes: int, healthy: Path, faulty: Path, fault_nodes: list[int]) -> Iterator[Fleet]:
    """The fleet in a process of its own (its CPU is not the launcher's)."""
    from scripts.ports import free_port

    process = subprocess.Popen([sys.executable, "-m", "bench.scale_launcher", "fleet", "--nodes", str(nodes),
                                "--healthy", str(healthy), "--faulty", str(faulty), "--port", str(free_port()),
                                "--fault-nodes", ",".join(map(str, fault_nodes))],
                               cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise SystemExit("the fake fleet did not start")
        started = json.loads(line)
        yield Fleet(process, started["sd"], started["control"])
    finally:
        process.terminate()
        process.wait(30)


# --- the launcher's side, in a process of its own -----------------------------------------------------------


def _clock() -> tuple[float, float]:
    return time.monotonic(), time.process_time()


def _since(start: tuple[float, float]) -> dict[str, float]:
    wall, cpu = _clock()
    return {"wall": round(wall - start[0], 3), "cpu": round(cpu - start[1], 3)}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(sd: str, control: str, fault_after: float, rounds: bool, full: bool,
            product_deadlines: bool = False) -> dict[str, Any]:
    """The launcher's watcher, then its recorder, as the checkout in the current directory has them; with
    `product_deadlines`, each read cut at the product's own deadline (the table then says how many answered)."""
    from launcher.health.exporters import from_sd
    from launcher.health.faults import Attempt
    from launcher.health.policy import HealthPolicy
    from launcher.health.watcher import Watcher

    out: dict[str, Any] = {}
    # No hang or silence within the bench: only the injected XIDs are faults.
    policy = HealthPolicy(check_interval_seconds=10, hang_after_seconds=86400, silence_after_seconds=86400)
    watcher = Watcher(policy, from_sd(sd))
    # This machine also runs the fleet (and maybe more): a check's reads get more than the 3 s default, so
    # that what is measured is the launcher's cost, not reads cut at a deadline the fleet cannot meet here.
    if not product_deadlines:
        watcher.read_timeout = MEASURE_DEADLINE_S
    watcher.watch(Attempt(1, "scale-a1", started_at=fault_after))
    for phase in ("cold", "steady", "training"):
        if phase == "training":
            _post(control + "/fake/tick")
        start = _clock()
        check = watcher.check()
        out[f"check_{phase}"] = {**_since(start), "reads": len(check.reads),
                                 "ok": sum(1 for read in check.reads if read.ok),
                                 "not_modified": sum(1 for read in check.reads if getattr(read, "not_modified", False)),
                                 "fault_nodes": sorted({fault.node for fault in check.faults if fault.node})}
        if not full:
            break
    out["check_rss_mb"] = round(_rss_mb(), 1)
    if rounds:
        from launcher import recording
        from launcher.recording import Recorder

        if not product_deadlines:
            recording.ROUND_READS_S = MEASURE_DEADLINE_S  # as for the watcher (a baseline without it ignores it)

        with tempfile.TemporaryDirectory() as directory:
            recorder = Recorder(Path(directory), sd, interval=3600)
            recorder.path.parent.mkdir(parents=True, exist_ok=True)
            for phase in ("cold", "steady", "training"):
                if phase == "training":
                    _post(control + "/fake/tick")
                before = recorder.samples
                start = _clock()
                recorder.record_once()
                out[f"round_{phase}"] = {**_since(start), "samples": recorder.samples - before,
                                         "bytes": recorder.path.stat().st_size}
                if not full:
                    break
            ups = [target.address for target in recorder._targets]  # what the round read
            out["round_targets"] = len(ups)
    out["rss_mb"] = round(_rss_mb(), 1)
    return out


def run_measure(cwd: Path, fleet_: Fleet, fault_after: float, rounds: bool, full: bool,
                product_deadlines: bool = False) -> dict[str, Any]:
    """`measure` in a process of its own, importing the launcher of the checkout at `cwd`."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    result = subprocess.run([sys.executable, str(REPO / "bench" / "scale_launcher.py"), "measure", "--sd", fleet_.sd,
                             "--control", fleet_.control, "--fault-after", str(fault_after),
                             *(["--rounds"] if rounds else []), *(["--full"] if full else []),
                             *(["--product-deadlines"] if product_deadlines else [])],
                            cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"measure in {cwd} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def fault_nodes_of(nodes: int) -> list[int]:
    """One faulty node per 500 (at least one), spread over the fleet."""
    count = max(1, nodes // 500)
    return [(index * nodes) // count + nodes // (2 * count) for index in range(count)]


def launcher_section(sizes: list[int], _cycles: int, baseline: Path | None, product_deadlines: bool = False) -> None:
    """The launcher's rows for bench/scale.py (SECTIONS["launcher"]); `product_deadlines`: see measure()."""
    rows: list[tuple[int, str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="raypulse-scale-") as directory:
        print("launcher: capturing a real 8-GPU exporter's bodies ...", file=sys.stderr, flush=True)
        healthy, faulty, began = capture(Path(directory))
        for nodes in sizes:
            faults = fault_nodes_of(nodes)
            with fleet(nodes, healthy, faulty, faults) as fake:
                if baseline is not None:
                    print(f"launcher: {nodes} nodes, baseline ...", file=sys.stderr, flush=True)
                    rows.append((nodes, "baseline", run_measure(baseline, fake, began, True,
                                                                full=nodes <= BASELINE_SKIP_ROUNDS_ABOVE,
                                                                product_deadlines=product_deadlines)))
                print(f"launcher: {nodes} nodes, this checkout ...", file=sys.stderr, flush=True)
                result = run_measure(REPO, fake, began, True, full=True, product_deadlines=product_deadlines)
                result["faults_expected"] = len(faults)
                rows.append((nodes, "this checkout", result))
    print_table(rows, product_deadlines)


def _cell(result: dict[str, Any], key: str) -> str:
    item = result.get(key)
    return f"{item['wall']:.2f} / {item['cpu']:.2f}" if item else "-"


def print_table(rows: list[tuple[int, str, dict[str, Any]]], product_deadlines: bool = False) -> None:
    print("\n### The launcher vs cluster size (bench.scale --section launcher)\n")
    print(f"Measured on {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          f"a fake fleet of exporters serving a real {GPUS}-GPU node's bytes ({RANKS} ranks training), one XID 79 "
          "node per 500. Wall s / CPU-s of the launcher's process; cold: the first; steady: nothing changed; "
          "training: every node advanced a step. Reads cut at "
          + ("the product's own deadlines" if product_deadlines else f"{MEASURE_DEADLINE_S:g} s (the fleet shares "
             "this machine)") + "; answered: the cold check's reads that came back.\n")
    print("| nodes | code | check cold | check steady | check training | 304s (steady) | faults seen | "
          "round cold | round steady | round training | samples / round | peak RSS (MB): watcher / both | "
          "answered |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for nodes, name, result in rows:
        steady = result.get("check_steady") or {}
        first = result.get("check_cold") or {}
        seen = len(first.get("fault_nodes", []))
        expected = result.get("faults_expected")
        print(f"| {nodes:,} | {name} | {_cell(result, 'check_cold')} | {_cell(result, 'check_steady')} | "
              f"{_cell(result, 'check_training')} | {steady.get('not_modified', '-')} | "
              f"{seen}{f' of {expected}' if expected else ''} | {_cell(result, 'round_cold')} | "
              f"{_cell(result, 'round_steady')} | {_cell(result, 'round_training')} | "
              f"{(result.get('round_cold') or {}).get('samples', '-'):,} | "
              f"{result['check_rss_mb']:.0f} / {result['rss_mb']:.0f} | {first.get('ok', '-')} of {nodes:,} |")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    serve = sub.add_parser("fleet")
    serve.add_argument("--nodes", type=int, required=True)
    serve.add_argument("--healthy", type=Path, required=True)
    serve.add_argument("--faulty", type=Path, required=True)
    serve.add_argument("--fault-nodes", default="")
    serve.add_argument("--port", type=int, required=True)
    run = sub.add_parser("measure")
    run.add_argument("--sd", required=True)
    run.add_argument("--control", required=True)
    run.add_argument("--fault-after", type=float, required=True)
    run.add_argument("--rounds", action="store_true")
    run.add_argument("--full", action="store_true")
    run.add_argument("--product-deadlines", action="store_true")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--baseline", type=Path)
    parser.add_argument("--product-deadlines", action="store_true",
                        help="reads cut at the product's own deadlines (default: 60 s, the fleet shares the machine)")
    args = parser.parse_args()
    if args.command == "fleet":
        serve_fleet(args.nodes, args.healthy, args.faulty,
                    [int(index) for index in args.fault_nodes.split(",") if index], args.port)
    elif args.command == "measure":
        print(json.dumps(measure(args.sd, args.control, args.fault_after, args.rounds, args.full,
                                 args.product_deadlines)))
    else:
        launcher_section([int(size) for size in args.sizes.split(",")], 0, args.baseline, args.product_deadlines)


if __name__ == "__main__":
    main()
