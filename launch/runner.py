"""One run from start to verdict: resolve, validate, plan, launch, collect, judge, summarize."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from launch import checkpoints, command, doctor, metrics, rules, supervise
from launch.recipes import LaunchError
from launch.resolve import resolve


def say(msg: str) -> None:
    print(f"[launch] {msg}", flush=True)


def gather_facts(setup) -> rules.Facts:
    parser = setup.recipe.load_train_module().make_parser()
    fields = {f.name for dc in parser.dataclass_types for f in dc.__dataclass_fields__.values()}
    gpu_count = 0 if setup.options.cpu else doctor.gpu_info()[0]
    return rules.Facts(
        versions=doctor.installed_versions(),
        gpu_count=gpu_count,
        model_config=rules.read_model_config(setup.training.get("model_name_or_path")),
        training_fields=frozenset(fields),
    )


MIN_FREE_BYTES = int(os.environ.get("LAUNCH_MIN_FREE_MB", "200")) * 2**20


def check_output_dir(path: Path, min_free: int = MIN_FREE_BYTES) -> None:
    """An unwritable or full output folder is found now, not after an hour of training."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise LaunchError(f"The output folder {path} is not writable ({e.strerror}). Pass --output-dir.") from None
    free = shutil.disk_usage(path).free
    if free < min_free:
        raise LaunchError(
            f"Only {free / 2**20:.0f} MiB are free under {path}; checkpoints, logs and the final weights need more "
            f"(at least {min_free / 2**20:.0f} MiB, LAUNCH_MIN_FREE_MB). Free space or pass another --output-dir."
        )


def child_env(setup) -> dict:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if setup.options.smoke:
        # Smoke runs are offline by construction: the model and the data are local files.
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def launch(options, dry_run: bool = False, record: bool = False) -> int:
    setup = resolve(options, progress=say)
    if os.environ.get("LAUNCH_DOCTOR_AT_START") == "1" and not dry_run:
        if doctor.run_doctor(setup, strict=True, out=lambda m: say(f"doctor: {m}")):
            raise LaunchError("The environment check failed (see the PROBLEM lines above); nothing was started.")
    problems = rules.check(setup, gather_facts(setup))
    if problems and not dry_run:
        raise LaunchError("\n\n".join(problems))

    cmd = command.build_command(setup)
    say(f"recipe {setup.recipe.name}, profile {setup.profile}")
    print(setup.plan.describe(), flush=True)
    print(command.display(cmd), flush=True)
    if dry_run:
        if problems:  # the plan is still worth seeing, e.g. an 8-GPU recipe planned on a laptop
            raise LaunchError("the plan above would not start:\n\n" + "\n\n".join(problems))
        return 0

    check_output_dir(setup.output_dir)
    log_path = setup.output_dir / "launch.log"
    log_start = log_path.stat().st_size if log_path.exists() else 0
    started = time.time()
    rc, stopped_by = supervise.run(cmd, log_path, env=child_env(setup))
    wall = time.time() - started

    state = setup.output_dir / "trainer_state.json"
    # a trainer_state.json older than this run belongs to an earlier run in the same folder
    history = metrics.read_history(setup.output_dir) if state.exists() and state.stat().st_mtime >= started else []
    observed = metrics.step_metrics(history)
    verdict = None
    status = rc
    if rc != 0:
        why = f"stopped by {stopped_by}" if stopped_by else f"exited with status {rc}"
        say(f"training {why}; the full log is {log_path}")
        failure = supervise.failure_summary(log_path, since=log_start)
        if failure:
            say(failure)
        last = checkpoints.newest_complete(setup.output_dir)
        if last is not None:
            say(f"last complete checkpoint: {last}; continue with the same command plus --resume")
    elif record:
        if not observed["loss"]:
            raise LaunchError(f"The run logged no per-step loss in {setup.output_dir}/trainer_state.json.")
        path = metrics.record(setup, observed)
        say(f"recorded {len(observed['loss'])} steps as the expected metrics of {setup.profile} in {path}")
    elif (setup.options.machine_rank or 0) > 0:
        say("machine rank > 0: the per-step metrics are logged and judged on machine rank 0")
    elif setup.options.smoke:
        verdict, status = judge(setup, observed)

    summary = {
        "recipe": setup.recipe.name,
        "profile": setup.profile,
        "command": cmd,
        "invocation": setup.invocation,
        "plan": setup.plan.as_dict(),
        "versions": doctor.installed_versions(),
        "world_size": setup.plan.world_size,
        "effective_batch": setup.plan.effective_batch,
        "wall_time_s": round(wall, 2),
        **metrics.run_totals(history),
        "exit_status": rc,
        "stopped_by": stopped_by,
        "observed": observed,
        "verdict": verdict,
    }
    (setup.output_dir / "run_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    say(f"summary: {setup.output_dir / 'run_summary.json'}")
    return status


def judge(setup, observed) -> tuple[dict | None, int]:
    expected_all = setup.recipe.expected_metrics()
    expected = (expected_all.get("profiles") or {}).get(setup.profile)
    record_cmd = f"python -m launch record {setup.recipe.name} --smoke{' --cpu' if setup.options.cpu else ''}"
    if not expected:
        say(f"no expected metrics for profile {setup.profile} in {setup.recipe.expected_metrics_path}; "
            f"record them deliberately with `{record_cmd}`")
        return {"passed": False, "reason": "no expected metrics for this profile"}, 3
    if expected.get("invocation") != setup.invocation:
        say(f"not judged: this run's layout {setup.invocation} differs from the recorded one "
            f"{expected.get('invocation')}")
        return {"passed": None, "reason": "layout differs from the recorded one"}, 0
    verdict = metrics.compare(expected, observed, expected_all.get("tolerance"))
    print(metrics.format_verdict(verdict), flush=True)
    return verdict, 0 if verdict["passed"] else 1
