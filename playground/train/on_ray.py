"""``python -m playground.train.on_ray``: the project's trainer under Ray Train, as a Ray job's entrypoint.

    python -m playground.train.on_ray --workers 2 [--cpus-per-worker 1] [--gpus-per-worker 0]
        [--max-failures 0] [--storage DIR] -- --blueprint tiny-llama-cpu --output DIR [--set ...]

The same ``python -m playground.train`` runs in every worker of a Ray Train ``TorchTrainer``: Ray Train starts
the workers, joins them into one torch process group (gloo on CPU, NCCL on GPU) and sets RANK/WORLD_SIZE/
LOCAL_RANK, so the trainer picks DDP or FSDP2 exactly as under torchrun. Rank 0 prints the ``@@playground``
events; Ray forwards the workers' output into this driver's log (the Ray job's log), where the backends read it.
The trainer arguments are checked here before Ray is asked for anything (bad input: one line, exit 2). While the
cluster lacks the workers' resources the driver says so (Phase Pending with Ray's figures); a cluster too small
ever to hold them is refused at once. With ``--max-failures N`` Ray Train restarts a failed worker group up to N
times and the trainer resumes from its latest checkpoint. A failure ends as Phase Failed with the reason, exit 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from playground.errors import UserError
from playground.events import JobPhase, Phase, format_event_line

PROG = "playground.train.on_ray"
PENDING_NOTE_SECONDS = 2.0  # how soon after the request a still-missing worker group is reported as Pending


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=f"python -m {PROG}", description="Run the blueprint trainer under Ray Train.")
    parser.add_argument("--workers", type=int, default=1, help="Ray Train workers (one trainer process each)")
    parser.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs Ray reserves per worker")
    parser.add_argument("--gpus-per-worker", type=float, default=0.0, help="GPUs per worker (0: CPU training)")
    parser.add_argument("--max-failures", type=int, default=0, help="worker-group restarts (resuming) before Failed")
    parser.add_argument("--storage", default=None, help="Ray Train's storage path (default: OUTPUT/ray)")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, help="-- then python -m playground.train's args")
    return parser


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The driver's options, checked (one-line errors naming the option)."""
    args = build_parser().parse_args(argv)
    if args.trainer_args[:1] == ["--"]:
        args.trainer_args = args.trainer_args[1:]
    if not args.trainer_args:
        raise UserError("no trainer arguments; allowed: -- --blueprint ID --output DIR [...]", field="trainer_args")
    if not 1 <= args.workers <= 512:
        raise UserError(f"--workers {args.workers}: allowed: 1 to 512", field="--workers")
    if not 0 < args.cpus_per_worker <= 1024:
        raise UserError(
            f"--cpus-per-worker {args.cpus_per_worker:g}: allowed: more than 0, at most 1024", field="--cpus-per-worker"
        )
    if not 0 <= args.gpus_per_worker <= 16:
        raise UserError(f"--gpus-per-worker {args.gpus_per_worker:g}: allowed: 0 to 16", field="--gpus-per-worker")
    if not 0 <= args.max_failures <= 100:
        raise UserError(f"--max-failures {args.max_failures}: allowed: 0 to 100", field="--max-failures")
    return args


def emit(phase: JobPhase, reason: str = "") -> None:
    print(format_event_line(Phase(phase=phase, reason=reason)), flush=True)


def worker_loop(config: dict[str, Any]) -> None:
    """One Ray Train worker: the project's trainer, resuming when its checkpoints show a restarted group."""
    from playground.train.__main__ import main

    if config.get("gpus"):  # Ray placed the job's GPUs (each worker sees its own): the trainer's fit check counts all
        os.environ["PLAYGROUND_GPU_COUNT"] = str(config["gpus"])
    argv = list(config["argv"])
    output = Path(config["output"])
    if "--resume" not in argv and _has_checkpoint(output):  # a restart after a failure: continue, don't redo
        argv.append("--resume")
    code = main(argv)
    if code:
        raise RuntimeError(f"the trainer exited with code {code} (its last lines are above)")


def _has_checkpoint(output: Path) -> bool:
    from playground.train.checkpoint import latest_checkpoint, latest_trl_checkpoint

    try:
        return latest_checkpoint(output / "checkpoints") is not None or latest_trl_checkpoint(output) is not None
    except Exception:  # an unreadable checkpoint: the trainer's own --resume check says what is wrong
        return False


def output_of(trainer_args: list[str]) -> Path:
    """The trainer's ``--output`` (the driver checks the whole command line with the trainer's own parser)."""
    from playground.train.__main__ import build_parser as trainer_parser

    return Path(trainer_parser().parse_known_args(trainer_args)[0].output).expanduser().resolve()


def job_gpus(args: argparse.Namespace) -> int:
    """The GPUs Ray gives the whole job (the workers', not the driver's machine's)."""
    return int(args.workers * args.gpus_per_worker)


def check_trainer_args(trainer_args: list[str], workers: int, gpus: int = 0) -> Path:
    """Run the trainer's own validation as the workers will (WORLD_SIZE = workers; the job's GPUs, not this
    machine's: the driver may run on a GPU-less head); the output dir."""
    from playground.train.__main__ import prepare

    overrides = {"WORLD_SIZE": str(workers), **({"PLAYGROUND_GPU_COUNT": str(gpus)} if gpus else {})}
    saved = {name: os.environ.get(name) for name in overrides}
    os.environ.update(overrides)
    try:
        return prepare(trainer_args).output
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def requested(args: argparse.Namespace) -> dict[str, float]:
    need = {"CPU": args.cpus_per_worker * args.workers}
    if args.gpus_per_worker:
        need["GPU"] = args.gpus_per_worker * args.workers
    return need


def _figures(resources: dict[str, float], keys: list[str]) -> str:
    return ", ".join(f"{key} {resources.get(key, 0.0):g}" for key in keys)


def check_cluster(args: argparse.Namespace) -> None:
    """Refuse a job the whole cluster could never hold (Ray Train would wait forever)."""
    import ray

    need, total = requested(args), ray.cluster_resources()
    short = [key for key, amount in need.items() if total.get(key, 0.0) < amount]
    if short:
        raise UserError(
            f"the Ray cluster has {_figures(total, list(need))} in all; {args.workers} worker(s) need "
            f"{_figures(need, list(need))}; allowed: fewer --workers or a larger cluster",
            field="--workers",
        )


def workers_alive(job_id: str) -> int:
    """This job's Ray Train workers that are up (Ray's state API)."""
    from ray.util.state import list_actors

    actors = list_actors(filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")], timeout=10)
    return sum(1 for actor in actors if actor.job_id == job_id)


def waiting_groups() -> list[str]:
    """Ray's scheduling state of each placement group still waiting for resources (NO_RESOURCES, INFEASIBLE)."""
    from ray.util import placement_group_table

    return [
        group["stats"]["scheduling_state"]
        for group in placement_group_table().values()
        if group["state"] == "PENDING" and group["stats"]["scheduling_state"] != "QUEUED"
    ]


def watch_pending(args: argparse.Namespace, done: threading.Event) -> None:
    """Until the workers are up: Phase Pending with Ray's reason and figures while their placement group waits
    for resources (another job holds them, or the cluster is scaling up)."""
    import ray

    job_id = ray.get_runtime_context().get_job_id()
    need = requested(args)
    said = False
    while not done.wait(PENDING_NOTE_SECONDS):
        try:
            if workers_alive(job_id) >= args.workers:
                return
            waiting = waiting_groups()
        except Exception:  # the state API is advisory: training goes on without the note
            return
        if waiting and not said:
            free = ray.available_resources()
            emit(
                JobPhase.PENDING,
                f"Ray is waiting for resources ({waiting[0]}): {args.workers} worker(s) need "
                f"{_figures(need, list(need))}; free now {_figures(free, list(need))}",
            )
            said = True


def fit(args: argparse.Namespace, output: Path) -> None:
    """Train under Ray Train; raises what Ray Train raises."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    ray.init(log_to_driver=True, configure_logging=False)
    check_cluster(args)
    resources = {"CPU": args.cpus_per_worker}
    if args.gpus_per_worker:
        resources["GPU"] = args.gpus_per_worker
    trainer = TorchTrainer(
        worker_loop,
        train_loop_config={"argv": args.trainer_args, "output": str(output), "gpus": job_gpus(args)},
        scaling_config=ScalingConfig(
            num_workers=args.workers, use_gpu=args.gpus_per_worker > 0, resources_per_worker=resources
        ),
        run_config=RunConfig(
            name=output.parent.name or "playground",
            storage_path=str(Path(args.storage).expanduser().resolve() if args.storage else output / "ray"),
            failure_config=FailureConfig(max_failures=args.max_failures),
        ),
    )
    done = threading.Event()
    threading.Thread(target=watch_pending, args=(args, done), daemon=True).start()
    try:
        trainer.fit()
    finally:
        done.set()


def failure_reason(exc: BaseException) -> str:
    """One line for Phase Failed: the first line of the workers' error, not Ray's wrapping."""
    text = str(exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if not line.startswith(("Traceback", "File ", "[Rank", "^"))]
    detail = errors[-1] if errors else (lines[0] if lines else "")
    worker_died = "ActorDiedError" in text or "died unexpectedly" in text or "exited unexpectedly" in text
    if worker_died:
        return f"a Ray Train worker died ({type(exc).__name__}: {detail})"[:500]
    return f"{type(exc).__name__}: {detail}"[:500]


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")  # every event line reaches the log, none folded as "repeated"
    try:
        args = parse(argv)
        output = check_trainer_args(args.trainer_args, args.workers, job_gpus(args))
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    try:
        fit(args, output)
    except UserError as exc:
        emit(JobPhase.FAILED, str(exc))
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        emit(JobPhase.CANCELLED, "interrupted")
        return 130
    except Exception as exc:  # the workers failed or died: Failed with the reason, after their last lines
        reason = failure_reason(exc)
        emit(JobPhase.FAILED, reason)
        print(f"{PROG}: error: {reason}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
