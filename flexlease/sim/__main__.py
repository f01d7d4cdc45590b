"""``python -m flexlease.sim``: run the trace-driven simulator and write the report and plots.

    python -m flexlease.sim --nodes 64 --days 60 --out DIR [--data DIR] [--seed N]
        [--policy all|both|ror|plain|static] [--gpu-models "MODEL:SHARE,..." | --cluster FILE]

Writes ``report.json`` (the same bytes for the same arguments), ``timing.json`` (wall-clock
figures) and the plots. Exit status: 0 when every policy ran to the end with no invariant
violated, 1 otherwise (the report still holds what it measured), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import uvloop

from flexlease.api.tiers import Tier
from flexlease.sim import cluster, driver, report, runner
from flexlease.sim.scenario import AUTOPILOT_MODES, DEFAULT_DATA_DIR, Scenario, parse_gpu_models
from flexlease.sim.traces import DAY


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, Scenario]:
    p = argparse.ArgumentParser(prog="python -m flexlease.sim", description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=None, help="general nodes (default 64)")
    p.add_argument("--gpus-per-node", type=int, default=None, help="(default 8)")
    p.add_argument("--standby-nodes", type=int, default=None, help="standby-pool nodes (default 4)")
    p.add_argument(
        "--cluster",
        type=Path,
        default=None,
        help="YAML cluster file: models and shares, optionally nodes, standby_nodes, gpus_per_node,"
        " online_model (see flexlease/sim/cluster.py)",
    )
    p.add_argument("--days", type=float, default=60.0, help="simulated days (default 60)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument(
        "--data", type=Path, default=DEFAULT_DATA_DIR, help=f"trace directory (default {DEFAULT_DATA_DIR})"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--policy", choices=("all", "both", "ror", "plain", "static"), default="all")
    p.add_argument("--trace", choices=("philly", "alibaba", "synthetic"), default="philly")
    p.add_argument(
        "--tick", type=float, default=600.0, help="scheduling round period, simulated s (default 600)"
    )
    p.add_argument(
        "--lp-load", type=float, default=3.0, help="offered LP load / GPUs free at peak (default 3)"
    )
    p.add_argument(
        "--lp-patience",
        type=float,
        default=600.0,
        help="s within which an LP gang must run after arriving to count as fulfilled (Fig. 10; default 600)",
    )
    p.add_argument("--online-gpus", type=int, default=None, help="online job's GPUs at peak (default half)")
    p.add_argument("--online-reliability", choices=("HA", "MA", "LA"), default="LA")
    p.add_argument(
        "--tier-refresh-hours",
        type=float,
        default=14 * 24.0,
        help="tier refresh period (default 336 = 14 days)",
    )
    p.add_argument(
        "--no-tide-shape", action="store_true", help="plain Fig. 2 cosine, without the Helios signal"
    )
    p.add_argument(
        "--tide",
        choices=("fig2", "irregular"),
        default="fig2",
        help="the online job's demand: the Fig. 2 tide (default) or irregular peaks and troughs of"
        " 10 min to 6 h (a stress test of right-of-return at the edges)",
    )
    p.add_argument(
        "--failure-scale",
        type=float,
        default=1.0,
        help="multiply the GPU failure rates of the Fig. 5 model (default 1)",
    )
    p.add_argument(
        "--standby-wait",
        type=float,
        default=600.0,
        help="s a Reclaim waits for a standby replacement before it lists a lent GPU unrecoverable"
        " (the lease controller's lease.standby_wait_seconds; default 600)",
    )
    p.add_argument(
        "--standby-mode",
        choices=("fixed", "adaptive"),
        default="fixed",
        help="the lease controller's lease.standby.mode: fixed (the --standby-nodes GPUs; default) or"
        " adaptive (per model, p99 of the Done Reclaims' shortfalls over 14 days + --standby-floor)",
    )
    p.add_argument(
        "--standby-floor", type=int, default=0, help="adaptive standby: GPUs kept per model (default 0)"
    )
    p.add_argument(
        "--gpu-models",
        default=None,
        help='GPU models and their shares of the nodes, e.g. "NVIDIA H20:0.7,NVIDIA H100 80GB HBM3:0.3"'
        ' (default "NVIDIA H20:1")',
    )
    p.add_argument(
        "--keep-state",
        action="store_true",
        help="write each policy's final objects to <out>/<policy>/state.json",
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="policies simulated at once, one process each (default: all of them, sharing the"
        " CPUs, so that they end together instead of one worker running two in turn; same report)",
    )
    p.add_argument(
        "--autopilot",
        choices=AUTOPILOT_MODES,
        default="off",
        help="who sizes the online job under --policy ror: off (the hand-written tide policy; default) or"
        " the lease autopilot with a GPULeasePolicy of that demand source, followed through its leases",
    )
    p.add_argument(
        "--autopilot-lead",
        type=int,
        default=600,
        help="the autopilot policy's leadTime, seconds (default 600)",
    )
    p.add_argument(
        "--demand-noise",
        type=float,
        default=0.0,
        help="day-to-day noise of the job's demand: std. dev. of a daily level around 1 (default 0)",
    )
    p.add_argument(
        "--surprise-peaks",
        type=float,
        default=0.0,
        help="surprise demand peaks per day (30 min-3 h, to 0.8-1.0 of the peak; seeded; default 0)",
    )
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    try:
        size, gpu_models = _cluster(args)
        scenario = Scenario(
            nodes=size["nodes"],
            gpus_per_node=size["gpus_per_node"],
            standby_nodes=size["standby_nodes"],
            days=args.days,
            seed=args.seed,
            tick=args.tick,
            online_gpus=args.online_gpus,
            online_reliability=Tier(args.online_reliability),
            trace=args.trace,
            data_dir=args.data,
            shape_tide=not args.no_tide_shape,
            tide_kind=args.tide,
            failure_scale=args.failure_scale,
            standby_wait=args.standby_wait,
            standby_mode=args.standby_mode,
            standby_floor=args.standby_floor,
            lp_load=args.lp_load,
            lp_patience=args.lp_patience,
            tier_refresh=args.tier_refresh_hours * 3600.0,
            gpu_models=gpu_models,
            warmup=min(DAY, args.days * DAY / 4),
            autopilot=args.autopilot,
            autopilot_lead=args.autopilot_lead,
            demand_noise=args.demand_noise,
            surprise_peaks=args.surprise_peaks,
        )
    except ValueError as exc:
        p.error(str(exc))
    return args, scenario


SIZE_DEFAULTS: Final = {"nodes": 64, "gpus_per_node": 8, "standby_nodes": 4}


def _cluster(args: argparse.Namespace) -> tuple[dict[str, int], tuple[tuple[str, float], ...]]:
    """The cluster's size and GPU models from ``--cluster`` and the command line; a value
    given in both places is refused. Raises ``ValueError`` (a :class:`ClusterFileError` for
    the file)."""
    size = {name: getattr(args, name) for name in SIZE_DEFAULTS}
    if args.cluster is None:
        models = parse_gpu_models(args.gpu_models or "NVIDIA H20:1")
    else:
        if args.gpu_models is not None:
            raise ValueError("give the GPU models with --cluster or --gpu-models, not both")
        spec = cluster.load(args.cluster)
        for name in SIZE_DEFAULTS:
            value = getattr(spec, name)
            if value is not None and size[name] is not None:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{name} is set in {args.cluster} and by {flag}: give it once")
            if value is not None:
                size[name] = value
        models = spec.gpu_models()
    return {k: v if v is not None else SIZE_DEFAULTS[k] for k, v in size.items()}, models


def main(argv: Sequence[str] | None = None) -> int:
    args, scenario = parse_args(argv)
    runner.quiet_logging(args.log_level)
    policies = list(driver.iter_policies(args.policy))
    # uvloop, as the extender serves (extender.main): less per-call overhead on both ends
    result, timing = uvloop.run(
        runner.run_all(
            scenario,
            policies,
            args.out,
            keep_state=args.keep_state,
            jobs=args.jobs or len(policies),
            log_level=args.log_level,
        )
    )
    json_path = report.write_json(result, args.out)
    report.write_json(timing, args.out, "timing.json")
    plots = report.plot(result, args.out)
    print(f"\nLP arrivals: {result['inputs']['lp_source']} ({result['inputs']['lp_pods']} pods)")
    print(f"tide: {result['inputs']['tide']}")
    print(report.table(result))
    print(f"\nreport: {json_path}")
    for path in plots:
        print(f"plot: {path}")
    print(f"wall time: {timing['wall_s']:.0f} s")
    failed = [n for n, s in result["policies"].items() if "error" in s or s["invariants"]["total"]]
    if failed:
        print(f"FAILED: {', '.join(failed)} (an error or invariant violations; see report.json)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
