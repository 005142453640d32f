"""One run from start to verdict: resolve, validate, plan, claim the output folder, launch, supervise, collect,
judge, summarize. Everything before `outdir.claim` only reads: a refused run leaves nothing behind."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import signal
import socket
import time
from pathlib import Path

from launch.checks import doctor, rules
from launch.config import envvars, profiles
from launch.facts import gpus, hub
from launch.results import outdir, sentinel
from launch.run import checkpoints, command, interrupt, supervise, tracking, upstream_warnings
from launch.speed import fastest, measured as throughput, model as throughput_model
from launch.rank import monitor
from launch.rank.measure import SYNC_ENV as MEASURE_SYNC_ENV
from launch.errors import LaunchError
from launch.results import judge
from launch.results.expected import profile_entry
from launch.results.history import read_history, run_totals, step_metrics
from launch.facts.machine import gpu_info, gpu_memory_gib, host_memory_gib, installed_versions, provenance
from launch.memory.plan import GPU_MEMORY_GIB, SPARE, default_target, describe, plan_memory
from launch.run.resolve import rendezvous_conf, resolve

# Hang timeout floors (seconds), per profile kind; the watchdog also scales them with the slowest step it sees.
HANG_FLOOR_S = {"smoke": 60.0, "full": 900.0}


def say(msg: str) -> None:
    print(f"[launch] {msg}", flush=True)


def gather_facts(setup) -> rules.Facts:
    gpu_count, names = (0, []) if setup.options.cpu else gpu_info()
    model = hub.read_model_config(setup.training.get("model_name_or_path"))
    return rules.Facts(
        versions=installed_versions(),
        gpu_count=gpu_count,
        model=model,
        missing_inputs=rules.missing_inputs(setup.training),
        memory=memory_plan(setup, model, gpu_count, names[0] if names else None),
    )


def memory_plan(setup, model, gpu_count: int, gpu_name: str | None = None):
    """The planner's view of this run on this machine: its GPUs' memory and model (the row of launch.facts.gpus torch's
    device name `gpu_name` matches: its peak and rates for the throughput model) when it has GPUs, else the planner's
    default target; its host memory. None when the model's architecture cannot be read."""
    if model.config is None:
        return None
    # --gpu names the GPU to plan for (e.g. a dry run on a machine without it); its memory where this one has no GPU
    named = gpus.lookup(setup.options.gpu) if setup.options.gpu else None
    memory = gpu_memory_gib() if gpu_count else named.memory_gib if named else GPU_MEMORY_GIB
    target = default_target(setup, memory, host_memory_gib())
    target = dataclasses.replace(target, gpu=named or gpus.detect(gpu_name))
    try:
        return plan_memory(setup, target, model=model)
    except (LaunchError, TypeError, ValueError):  # an architecture the memory model does not know (e.g. MoE)
        return None


def check_resume(setup) -> None:
    """--resume: the checkpoint was saved by a run like this one, and the output folder holds no other run's results
    (reads only)."""
    checkpoint = setup.training.get("resume_from_checkpoint")
    if not setup.options.resume or not checkpoint:
        return
    checkpoint, run = Path(checkpoint), checkpoints.identity(setup)
    problems = checkpoints.resume_problems(checkpoint, run)
    folder_run = (outdir.read_manifest(setup.output_dir) or {}).get("run")
    if checkpoint.parent != setup.output_dir and isinstance(folder_run, dict) and folder_run != run:
        problems.append(f"the output folder {setup.output_dir} holds the results of another run "
                        f"({folder_run.get('recipe')}, "
                        f"{folder_run.get('strategy')}), which this run would write over")
    if problems:
        raise LaunchError(
            "--resume " + str(checkpoint) + ": " + "; ".join(problems) + ". A checkpoint resumes only with the recipe, "
            "strategy, mesh and model (and, for ZeRO and FSDP, the world size) that saved it. Resume it with the "
            "recipe that saved it, or start this recipe afresh in a new --output-dir (without --resume).")


def child_env(setup, monitor_dir: Path, sentinel_env: dict | None = None) -> dict:
    env = command.code_env(dict(os.environ))
    env["PYTHONUNBUFFERED"] = "1"
    env[monitor.ENV] = str(monitor_dir)
    # every run measures itself (cheap: no per-step GPU sync); --bench syncs at every step for exact step times
    env[monitor.BENCH_ENV] = str(setup.options.bench_warmup)
    if setup.options.bench:
        env[MEASURE_SYNC_ENV] = "1"
    env.update(sentinel_env or {})
    env.update(tracking.env(setup))
    env.update(upstream_warnings.env(env))  # DeepSpeed's and Accelerate's deprecated torch collectives, every step
    if setup.options.cpu:
        env.update({k: v for k, v in profiles.cpu_env(setup.training).items() if k not in env})  # the user's own wins
    if setup.options.smoke:
        # Smoke runs are offline by construction: the model and the data are local files.
        env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env


def loss_sentinel(setup, say=say, model=None) -> dict:
    """The ranks' environment for the first-steps loss sentinel (launch.results.sentinel): for a synthetic run, the
    band of a random model's first loss (about ln(vocabulary)); else the band recorded for this recipe and profile in
    expected_metrics.json (checked when it was read), or {} (off: no band, asked off, or a run that is another run
    than the band was recorded with: another architecture, RoPE, length or layout; each said). `model`: the model's
    config as launch.facts.hub read it (read here when not given)."""
    config = (model if model is not None else hub.read_model_config(setup.training.get("model_name_or_path"))).config
    if setup.options.synthetic:
        entry = {sentinel.KEY: band} if (band := sentinel.random_init_band(config)) else None
    else:
        entry = profile_entry(setup.recipe, setup.profile)
        band = sentinel.band_of(entry)
    if not band:
        if setup.options.synthetic:
            say("loss sentinel off: the model's config was not read, so its vocabulary size is unknown")
        return {}
    if not setup.options.loss_sentinel:
        say("loss sentinel off (--no-loss-sentinel)")
    elif differences := sentinel.mismatch(band, setup.training, config, setup.layout):
        say("loss sentinel off: the band was recorded with other settings: " + "; ".join(differences))
    else:
        say(f"loss sentinel: the first {band['steps']} logged loss(es) must lie in [{band['low']:g}, {band['high']:g}] "
            f"({band['source']})")
        return sentinel.env_for(entry, recipe=setup.recipe.name, profile=setup.profile)
    return {}


def rendezvous_wait_line(setup) -> str | None:
    """Machine rank 0 of a multi-machine run: what its ranks wait for before the first step, and for how long
    (torchrun's static rendezvous, bounded by --rendezvous-timeout through `rdzv_conf`, launch.run.resolve)."""
    o, machines = setup.options, setup.layout.num_machines
    if machines <= 1 or (o.machine_rank or 0) != 0:
        return None
    timeout = rendezvous_conf(setup.accelerate).get("timeout")
    bound = (f"up to {timeout} s (" + ("--rendezvous-timeout" if "rdzv_conf" in setup.accelerate_overrides
                                        else "rdzv_conf in the Accelerate config") + ")") if timeout else \
        "as long as torchrun's default rendezvous timeout"
    return (f"machine rank 0: training starts once the other {machines - 1} machine(s) have joined at "
            f"{o.main_process_ip}:{o.main_process_port or 29500}; torchrun waits {bound} for them, then fails")


def wait_for_rendezvous(host: str, port: int, timeout: float) -> None:
    """Machine ranks > 0: wait (bounded) until machine rank 0 accepts connections, instead of torchrun's silent wait."""
    say(f"waiting up to {timeout:.0f} s for machine rank 0 at {host}:{port}")
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=min(5.0, timeout)):
                return
        except OSError as e:
            last = e
            time.sleep(1.0)
    raise LaunchError(f"Machine rank 0 at {host}:{port} did not answer within {timeout:.0f} s ({last}). Check "
                      "--main-process-ip / --main-process-port (MASTER_ADDR / MASTER_PORT), that machine rank 0 "
                      "has started, and the firewall; --rendezvous-timeout sets this wait.")


def fastest_setup(setup):
    """--fastest: the fastest speed settings that fit this machine (`launch.speed.fastest`: its GPUs' memory and peak,
    Liger if it has a GPU and liger-kernel), printed, and the run with them as the layer of training arguments below
    the user's `--` ones (`Setup.with_fastest`). Returns (setup, the search or None)."""
    gpu_count, names = (0, []) if setup.options.cpu else gpu_info()
    model = hub.read_model_config(setup.training.get("model_name_or_path"))
    plan = memory_plan(setup, model, gpu_count, names[0] if names else None)
    if plan is None:
        say("--fastest: nothing chosen: the model's architecture was not read (the planner needs its config.json)")
        return setup, None
    found = fastest.search(setup, plan, liger_installed=fastest.liger_on_this_machine(gpu_count))
    print(fastest.describe(found), flush=True)
    if found.chosen is None:
        say("--fastest: no candidate fits this machine; the run keeps its own settings")
        return setup, found
    argv, accelerate = fastest.arguments(setup, found.chosen.settings)
    applied = " ".join(argv + [f"--{k} {str(v).lower()}" for k, v in accelerate.items()])
    say(f"--fastest: {found.chosen.settings.label()}" + (f" ({applied})" if applied else " (the run's own settings)"))
    return setup.with_fastest((argv, accelerate)), found


def launch(options, dry_run: bool = False) -> int:
    """One run."""
    # multi-node: a flag, else the variables of the scheduler that started us (SLURM, SkyPilot, a TrainJob)
    rendezvous = envvars.rendezvous(options)
    options = dataclasses.replace(options, **rendezvous.options())
    setup = resolve(options, progress=say)
    found = None
    if options.fastest:
        setup, found = fastest_setup(setup)
    if envvars.doctor_at_start() and not dry_run:
        if doctor.run_doctor(setup, strict=True, out=lambda m: say(f"doctor: {m}")):
            raise LaunchError("The environment check failed (see the PROBLEM lines above); nothing was started.")
    check_resume(setup)
    facts = gather_facts(setup)
    report = rules.check(setup, facts)
    min_free = envvars.min_free_bytes()
    try:
        claim = outdir.check(setup.output_dir, resume=bool(options.resume), overwrite=options.overwrite,
                             machine_rank=options.machine_rank or 0, min_free=min_free)
    except LaunchError as e:
        if not dry_run:
            raise
        report.machine_problems.append(str(e))
        claim = None

    cmd = command.build_command(setup)
    say(f"recipe {setup.recipe.name}, profile {setup.profile}")
    if line := rendezvous.describe():
        say(line)
    if line := rendezvous.process_count_line(setup.layout.world_size, setup.layout.processes_per_machine):
        say(line)
    if line := rendezvous_wait_line(setup):
        say(line)
    if line := rules.skipped_line(setup, facts, report):
        say(line)
    print(setup.layout.describe(), flush=True)
    print(setup.precision.describe(), flush=True)
    if setup.layout.max_length:
        covered, source = rules.rope_coverage(setup, facts.model_config)
        print(f"positions                {covered:,} covered by {source}" if covered else
              f"positions                {source} (the model's config was not read)", flush=True)
    if facts.memory is not None and (dry_run or not options.cpu):
        print(describe(facts.memory), flush=True)
        if facts.memory.fits and not facts.memory.fits_with_spare and not options.cpu:
            say(f"the planner predicts {facts.memory.estimate.gpu_peak_gib:.1f} GiB per GPU of "
                f"{facts.memory.target.gpu_memory_gib:.1f}: within the launcher's {SPARE:.0%} spare (the planner's "
                "measured error), so it may not fit; --fastest never chooses such settings")
    print(command.display(cmd), flush=True)
    for note in setup.notes + (claim.notes if claim else []):
        say(note)
    sentinel_env = loss_sentinel(setup, model=facts.model)
    if dry_run:
        if report.problems:
            raise LaunchError("the plan above would not start:\n\n" + "\n\n".join(report.all))
        said = {rules.gpu_memory_fits(setup, facts), rules.host_memory_fits(setup, facts)} - {None}
        if facts.memory is not None and not facts.memory.fits and not said:
            # the table above says "does NOT fit" (e.g. a CPU dry run, where the memory rules do not apply): said
            # here too, under the documented status of a valid plan this machine could not run (exit 0)
            est, target = facts.memory.estimate, facts.memory.target
            report.machine_problems.append(
                f"The memory plan above does NOT fit its target: {est.gpu_peak_gib:.1f} GiB per GPU of "
                f"{target.gpu_memory_gib:.1f}" + (f", {est.host_per_node_gib:.1f} GiB of host memory per node of "
                f"{target.host_memory_gib:.1f}" if (target.host_memory_gib or math.inf) < est.host_per_node_gib
                                                 else "") + ". "
                f"{est.advice(target.gpu_memory_gib, target.host_memory_gib)} "
                f"`python -m launch plan {setup.recipe.name} --max-length auto` finds the longest length that fits.")
        if report.machine_problems:  # e.g. an 8-GPU recipe planned on a laptop: the plan is valid
            say("the plan is valid, but this machine could not run it:\n\n" + "\n\n".join(report.machine_problems))
        return 0
    if options.force and report.machine_problems:
        fits = {rules.gpu_memory_fits(setup, facts), rules.host_memory_fits(setup, facts)} - {None}
        for msg in fits:
            say(f"--force: starting although: {msg}")
        report.machine_problems = [m for m in report.machine_problems if m not in fits]
    if report.all:
        raise LaunchError("\n\n".join(report.all))

    if (options.machine_rank or 0) > 0:
        wait_for_rendezvous(options.main_process_ip, options.main_process_port or 29500, options.rendezvous_timeout)
    interrupt.writing()  # everything above only read; from here a Ctrl-C raises, so that the lock is released last
    outdir.claim(claim, command=" ".join(cmd), run=checkpoints.identity(setup))
    finishing = interrupt.Finishing()  # from the job's end: a Ctrl-C no longer interrupts the summary or the release
    try:
        setup.folder.check_writable()
        return _run(setup, cmd, facts, sentinel_env, found, finishing)
    finally:
        outdir.release(claim)
        finishing.end()


def steps_done(monitor_dir: Path) -> int | None:
    """The last optimizer step every rank of this machine has finished, from their heartbeats (None: no heartbeat)."""
    beats = monitor.read_heartbeats(monitor_dir)
    if not beats:
        return None
    return min(b["step"] - (1 if b["event"] == "step_begin" else 0) for b in beats.values())


def stopped_where(stopped_by: str, steps: int | None) -> str:
    """A run the user stopped (Ctrl-C or SIGTERM), and where: "stopped (Ctrl-C) after step 5"."""
    how = "Ctrl-C" if stopped_by == "SIGINT" else stopped_by
    return f"stopped ({how}) " + (f"after step {steps}" if steps else "before its first step")


def stop_line(stopped_by: str, steps: int | None, last: Path | None, log_path: Path) -> str:
    """The one line of a run the user stopped: where it stopped, and what to resume from."""
    keep = (f"last complete checkpoint: {last}; continue with the same command plus --resume" if last is not None
            else "no complete checkpoint to resume from")
    return f"{stopped_where(stopped_by, steps)}: {keep} (the full log: {log_path})"


def _run(setup, cmd, facts, sentinel_env: dict, found=None, finishing=None) -> int:
    folder = setup.folder
    log_path = folder.log
    log_start = log_path.stat().st_size if log_path.exists() else 0
    monitor_dir = folder.monitor
    shutil.rmtree(monitor_dir, ignore_errors=True)
    floor = setup.options.hang_timeout or HANG_FLOOR_S["smoke" if setup.options.smoke else "full"]
    per_machine = setup.layout.processes_per_machine
    first = (setup.options.machine_rank or 0) * per_machine
    watchdog = supervise.Watchdog(monitor_dir, list(range(first, first + per_machine)), floor)
    merged_before = folder.merged.is_dir()  # by `launch merge` from an earlier final/ (a resumed run rewrites final/)
    started = time.time()
    rc, stopped_by = supervise.run(cmd, log_path, env=child_env(setup, monitor_dir, sentinel_env), watchdog=watchdog,
                                   finishing=finishing)
    wall = time.time() - started

    state = folder.trainer_state
    # a trainer_state.json older than this run belongs to an earlier run in the same folder
    history = read_history(setup.output_dir) if state.exists() and state.stat().st_mtime >= started else []
    observed = step_metrics(history)
    verdict = None
    status = rc
    stopped = supervise.user_stop(stopped_by)
    if stopped:
        # a stop the user asked for is no failure: one line (torchrun's traceback of the SIGTERM its group was sent
        # stays in the log), and the status a shell gives a process that signal ended (130 for Ctrl-C)
        steps = steps_done(monitor_dir)
        say(stop_line(stopped_by, steps, checkpoints.newest_complete(setup.output_dir), log_path))
        status = 128 + signal.Signals[stopped_by]
        verdict = {"passed": None, "reason": f"{stopped_where(stopped_by, steps)}: not judged"}
    elif rc != 0 or stopped_by:
        why = stopped_by.split(": ", 1)[0] if stopped_by else None
        say(f"training {'stopped by ' + why if why else f'exited with status {rc}'}; the full log is {log_path}")
        if stopped_by and stopped_by.startswith("hang: "):
            say(stopped_by[len("hang: "):])
        elif failure := supervise.failure_summary(log_path, since=log_start):
            say(failure)
        last = checkpoints.newest_complete(setup.output_dir)
        if last is not None:
            say(f"last complete checkpoint: {last}; continue with the same command plus --resume")
        status = rc or 1
    elif setup.options.record:
        if not observed["loss"]:
            raise LaunchError(f"The run logged no per-step loss in {state}.")
        path = judge.record(setup, observed)
        say(f"recorded {len(observed['loss'])} steps as the expected metrics of {setup.profile} in {path}")
    elif (setup.options.machine_rank or 0) > 0:
        say("machine rank > 0: the per-step metrics are logged and judged on machine rank 0")
    elif setup.options.smoke:
        verdict, status = judge.judge_run(setup, observed, say=say)

    summary = {
        "recipe": setup.recipe.name,
        "profile": setup.profile,
        "command": cmd,
        "invocation": setup.invocation,
        "layout": setup.layout.as_dict(),
        "versions": installed_versions(),
        "provenance": provenance(),  # git revision; the image (id facts and reference) when run in one
        "world_size": setup.layout.world_size,
        "effective_batch": setup.layout.effective_batch,
        "wall_time_s": round(wall, 2),
        **run_totals(history),
        # the launcher's own exit status (130: stopped by Ctrl-C; 1: a judged miss or a failure), and the job's
        "exit_status": status,
        "job_exit_status": rc,
        # stopped (by the user: Ctrl-C, SIGTERM), hang, failed, or finished (then judged or not: `verdict`)
        "outcome": "stopped" if stopped else "hang" if stopped_by else "failed" if rc != 0 else "finished",
        "stopped_by": stopped_by,
        "observed": observed,
        "verdict": verdict,
        "tracking": tracking.summary(setup),
        "saves": setup.saves,  # what the run keeps besides its logs: checkpoints, final weights, or "nothing"
        # --fastest: the speed settings chosen for this machine, what they set, the candidates (None without it)
        "fastest": None if found is None else {**found.as_json(), "applied": setup.invocation.get("fastest")},
    }
    summary["bench"] = bench_report(setup, facts, folder.bench, quiet=stopped)
    # the job's tokens/s after warm-up, all processes together: the figure the bench's console line prints
    summary["tokens_per_second"] = summary["bench"]["overall"]["tokens_per_s"] if summary["bench"] else None
    # of them the real ones, counted from each batch's attention mask (or position ids when padding-free)
    summary["non_pad_tokens_per_second"] = summary["bench"]["overall"]["non_pad_tokens_per_s"] \
        if summary["bench"] else None
    if line := tracking.dashboard_line(setup):
        say(line)
    summary["loss_sentinel"] = sentinel.read_verdict(monitor_dir) if sentinel_env else None
    if merged_before and _written_since(folder.final, started):
        summary["stale"] = [str(folder.merged)]
        say(f"{folder.merged} is stale: it was merged from the final/ of the run before this one, and this run has "
            f"written a new final/. Delete it and merge again: `rm -r {folder.merged} && python -m launch merge "
            f"{setup.output_dir}`.")
    folder.summary.write_text(json.dumps(summary, indent=2) + "\n")
    say(f"summary: {folder.summary}")
    return status


def _written_since(folder: Path, since: float) -> bool:
    """Whether a file in `folder` was written at or after `since` (a folder's own mtime misses files rewritten in
    place)."""
    return folder.is_dir() and any(p.stat().st_mtime >= since for p in folder.rglob("*") if p.is_file())


def bench_report(setup, facts, folder: Path, quiet: bool = False) -> dict | None:
    """Every run: the ranks' measurements combined (tokens/s per GPU, MFU in both conventions, each rank's peak
    memory), each memory figure beside the planner's prediction for the same run. The per-step table is printed
    with --bench. `quiet`: no line when there are none (a stopped run, whose ranks write them at the end)."""
    plan = facts.memory
    flops = predicted = None
    if plan is not None:
        try:
            cost = throughput_model.predict(plan.arch, plan.run, gpu=plan.target.gpu)
            flops, predicted = cost.flops, cost.tokens_per_s_per_gpu
        except (TypeError, ValueError, ZeroDivisionError):  # a shape the throughput model does not know
            pass
    report = throughput.report(folder, plan.arch if plan else None, setup.layout.max_length,
                               plan.estimate if plan else None, flops, predicted)
    if report is None:
        if not quiet:
            say("bench: no rank wrote measurements")
        return None
    print(throughput.format_report(report, per_step=setup.options.bench), flush=True)
    return report
