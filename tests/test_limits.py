"""Bounds on what a job may spend (harness/executors/limits.py), for real: jobs that hog memory,
fork, fill folders, write a huge file or flood their log, run through runner.run_training with
small bounds; the evaluation's own deadline and its cancel; no printed figure on a failed row."""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.config.load import resolve
from harness.executors import evaluation, limits, scoring
from harness.integrity import guard
from harness.workload.runner import TrainResult, run_training

from conftest import git, make_repo, own_cgroups

PY = sys.executable
MB = 1 << 20


def job(tmp_path: Path, code: str, bounds: limits.Limits, name: str = "job", kill_after_s: float = 60):
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    return run_training(f"{PY} {script}", tmp_path, dict(os.environ), tmp_path / f"{name}.log", "val_bpb",
                        kill_after_s=kill_after_s, limits=bounds)


def cgroups_here() -> bool:
    group = limits.Cgroup.make(limits.Limits(memory_mb=64, pids=64))
    if group is None:
        return False
    group.remove()
    return True


needs_cgroup = pytest.mark.skipif(not cgroups_here(), reason="no writable cgroup (memory, pids) on this machine")


def leftover_cgroups() -> list[Path]:
    return own_cgroups(limits.CGROUP_ROOT)


@needs_cgroup
def test_a_memory_hog_is_killed_at_its_bound_and_the_row_names_it(tmp_path):
    result = job(tmp_path, "hog = bytearray(1 << 30)\nprint('allocated')\n", limits.Limits(memory_mb=128))
    assert result.status == "invalid", result
    assert "128 MB memory bound" in result.reason and "--job-memory-mb" in result.reason
    assert leftover_cgroups() == []


@needs_cgroup
def test_a_fork_bomb_stops_at_the_process_bound(tmp_path):
    bomb = ("import os, time\nwhile True:\n    if os.fork() == 0:\n        time.sleep(30)\n        os._exit(0)\n")
    t0 = time.monotonic()
    result = job(tmp_path, bomb, limits.Limits(pids=32))
    assert result.status == "invalid", result
    assert "bound of 32 processes" in result.reason and "--job-pids" in result.reason
    assert time.monotonic() - t0 < 30  # the sleeping children were killed with the group
    assert leftover_cgroups() == []


def test_a_folder_filled_past_the_disk_bound_kills_the_job(tmp_path):
    (tmp_path / "out").mkdir()
    filler = (f"import time\nfor i in range(60):\n    open(f'{tmp_path}/out/f{{i}}', 'wb').write(b'x' * (4 << 20))\n"
              f"    time.sleep(0.1)\ntime.sleep(60)\n")
    result = job(tmp_path, filler, limits.Limits(disk_mb=16).watching(output_folder=tmp_path / "out"))
    assert result.status == "invalid", result
    assert "16 MB disk bound to its output folder" in result.reason and "--job-disk-mb" in result.reason
    assert result.train_s < 30


def test_a_filler_faster_than_the_watch_is_measured_when_it_exits(tmp_path):
    (tmp_path / "tmp").mkdir()
    filler = f"for i in range(8):\n    open(f'{tmp_path}/tmp/f{{i}}', 'wb').write(b'x' * (4 << 20))\n"
    result = job(tmp_path, filler, limits.Limits(disk_mb=16).watching(private_tmp=tmp_path / "tmp"))
    assert result.status == "invalid" and "private tmp" in result.reason, result


def test_one_file_past_the_disk_bound_is_refused_by_the_kernel(tmp_path):
    result = job(tmp_path, f"open('{tmp_path}/big', 'wb').write(b'x' * (40 << 20))\n", limits.Limits(disk_mb=16))
    assert result.status == "invalid" and "file larger than its 16 MB" in result.reason, result
    assert (tmp_path / "big").stat().st_size <= 16 * MB


def test_a_log_flood_is_stopped_at_its_bound_head_and_tail_kept_and_the_supervisor_stays_small(tmp_path):
    flood = ("import sys\nline = 'x' * 1023 + '\\n'\nfor _ in range(300 * 1024):\n    sys.stdout.write(line)\n"
             "print('---')\nprint('val_bpb: 1.234')\n")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KB
    result = job(tmp_path, "print('first line')\n" + flood, limits.Limits(log_mb=4))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert result.status == "invalid" and "4 MB log bound" in result.reason and "--job-log-mb" in result.reason
    assert result.value("val_bpb") is None
    log = tmp_path / "job.log"
    assert log.stat().st_size < 4 * MB + 4096
    text = log.read_bytes()
    assert text.startswith(b"first line\n") and b"bytes of output cut here" in text
    assert set(text[-64 * 1024:]) <= set(b"x\n")  # the flood's last bytes (the kill may land mid-line)
    assert grown_mb < 32, f"the supervisor grew by {grown_mb:.0f} MB over a flood"


def test_a_log_past_its_bound_at_exit_is_cut_and_the_job_judged(tmp_path):
    block = "import sys\nsys.stdout.write(('y' * 1023 + '\\n') * 3072)\nprint('---')\nprint('val_bpb: 1.5')\n"
    result = job(tmp_path, block, limits.Limits(log_mb=2))  # 3 MB at once: done before the next poll
    text = (tmp_path / "job.log").read_bytes()
    if result.status == "invalid":  # a slow machine's poll saw it first
        assert "2 MB log bound" in result.reason
    else:
        assert result.status == "ok" and result.value("val_bpb") == 1.5, result
        assert b"bytes of output cut here" in text and text.endswith(b"val_bpb: 1.5\n")
    assert len(text) < 2 * MB + 4096


def test_unbounded_settings_and_the_machines_defaults(tmp_path):
    cfg = resolve(make_repo(tmp_path / "r"), "t", {"job_memory_mb": 0, "job_pids": 7})
    bounds = limits.of(cfg, tmp_path)
    assert bounds.memory_mb == 0 and bounds.pids == 7 and bounds.log_mb == limits.DEFAULT_LOG_MB
    assert 0 < bounds.disk_mb <= limits.DISK_CAP_MB
    assert limits.defaults(tmp_path).memory_mb == limits.mem_total_mb() // 2
    accounting = limits.Cgroup.make(limits.Limits(memory_mb=0, pids=0))  # no bound: only the CPU accounting
    if accounting is not None:
        try:
            assert accounting.cpu_seconds() == 0.0 and accounting.exceeded(limits.Limits()) is None
        finally:
            accounting.remove()
    with pytest.raises(Exception, match="--job-log-mb.*integer >= 1"):
        resolve(tmp_path / "r", "t", {"job_log_mb": 0})


def test_a_failed_job_has_no_metric_whatever_it_printed():
    crashed = TrainResult("crash", {"val_bpb": 0.0001}, returncode=1, reason="exit code 1")
    assert crashed.value("val_bpb") is None
    assert TrainResult("ok", {"val_bpb": 1.5}).value("val_bpb") == 1.5


def test_the_evaluation_deadline_is_calibrated_on_the_baseline(tmp_path):
    assert scoring.eval_deadline(None, tmp_path, "base", at_base=False)[0] == scoring.EVAL_UNCALIBRATED_S
    scoring.calibrate_eval(tmp_path, "base", 100.0)
    scoring.calibrate_eval(tmp_path, "base", 50.0)
    seconds, why = scoring.eval_deadline(None, tmp_path, "base", at_base=False)
    assert seconds == 400.0 and "100.0s evaluation" in why
    assert scoring.eval_deadline(None, tmp_path, "base", at_base=True)[0] == scoring.EVAL_UNCALIBRATED_S
    assert scoring.eval_deadline(None, tmp_path, "other", at_base=False)[0] == scoring.EVAL_UNCALIBRATED_S
    assert scoring.eval_deadline(7.0, tmp_path, "base", at_base=False)[0] == 7.0


SLOW_EVAL = ("import json, os, time\ntime.sleep({sleep})\n"
             "json.dump({{'val_bpb': 0.9}}, open(os.environ['HARNESS_RESULT_FILE'], 'w'))\n")


def eval_repo(tmp_path: Path, sleep: float, extra: str = "") -> Path:
    repo = make_repo(tmp_path / "research", kill_after=3,
                     extra=f'evaluate_command = "{PY} evaluate.py"\n{extra}')
    (repo / "evaluate.py").write_text(SLOW_EVAL.format(sleep=sleep))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "the evaluator")
    return repo


def test_the_baselines_evaluation_is_not_bound_by_the_trainings_kill_after(tmp_path):
    repo = eval_repo(tmp_path, sleep=5)  # the evaluation takes longer than training's kill_after (3 s)
    cfg = resolve(repo, "t", {"protected": ["prepare.py", "evaluate.py"]})
    result = evaluation.train(cfg, repo, tmp_path / "logs" / "job.log", seed=1)
    assert result.status == "ok" and result.value("val_bpb") == 0.9, result
    assert scoring.read_eval_times(tmp_path / "logs", guard.baseline_commit(cfg.protected, repo, "", {}))  # calibrated


def test_eval_kill_after_bounds_the_evaluation(tmp_path):
    repo = eval_repo(tmp_path, sleep=30)
    cfg = resolve(repo, "t", {"protected": ["prepare.py", "evaluate.py"], "eval_kill_after": 2})
    result = evaluation.train(cfg, repo, tmp_path / "logs" / "job.log", seed=1)
    assert result.status == "timeout" and "--eval-kill-after" in result.reason, result
    assert result.value("val_bpb") is None and "val_bpb" not in result.metrics  # not the job's printed 1.0


def cancelled_promptly(cfg, repo: Path, tmp_path: Path, started: Path) -> None:
    """evaluation.train in a thread, cancelled once started exists: KeyboardInterrupt, promptly."""
    cancel, raised = threading.Event(), []

    def train():
        try:
            evaluation.train(cfg, repo, tmp_path / "logs" / "job.log", seed=1, cancel=cancel)
        except KeyboardInterrupt as e:
            raised.append(e)
    thread = threading.Thread(target=train)
    thread.start()
    until = time.monotonic() + 60
    while not started.exists() and time.monotonic() < until:
        time.sleep(0.1)
    assert started.exists(), f"{started.name} never started"
    t0 = time.monotonic()
    cancel.set()
    thread.join(30)
    assert not thread.is_alive() and raised, f"{started.name} did not stop on cancel"
    assert time.monotonic() - t0 < 15


def test_cancel_stops_an_evaluation_as_promptly_as_a_training_job(tmp_path):
    repo = eval_repo(tmp_path, sleep=120)
    cfg = resolve(repo, "t", {"protected": ["prepare.py", "evaluate.py"]})
    cancelled_promptly(cfg, repo, tmp_path, tmp_path / "logs" / "job.eval.log")


def test_cancel_stops_a_training_data_export(tmp_path):
    repo = eval_repo(tmp_path, sleep=1, extra=f'train_data_command = "{PY} -c \'import time; time.sleep(120)\'"\n')
    cfg = resolve(repo, "t", {"protected": ["prepare.py", "evaluate.py"]})
    cancelled_promptly(cfg, repo, tmp_path, tmp_path / "logs" / "train-data" / "export.log")


def test_without_a_cgroup_processes_and_files_fall_back_to_rlimits(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "CGROUP_ROOT", tmp_path / "no-cgroups")
    bounds = limits.Limits(memory_mb=64, pids=32, disk_mb=16)
    assert limits.Cgroup.make(bounds) is None
    argv = limits.prefix(bounds, None)
    assert argv[1:] == ["--fsize=16777216", "--nproc=32", "--"] and argv[0].endswith("prlimit")
    result = job(tmp_path, f"open('{tmp_path}/big', 'wb').write(b'x' * (40 << 20))\n", bounds)
    assert result.status == "invalid" and "file larger than its 16 MB" in result.reason, result


@needs_cgroup
def test_a_daemon_that_left_the_group_and_its_marks_dies_with_the_jobs_cgroup(tmp_path):
    """setsid + env -i: out of the process group and without the supervisor's token; the cgroup
    still holds it, and the job's end kills it (here unsandboxed: no PID namespace to do it)."""
    pid_file = tmp_path / "daemon.pid"
    code = (f"import subprocess\nsubprocess.Popen(['setsid', 'env', '-i', 'sh', '-c', 'echo $$ > {pid_file}; "
            f"exec sleep 300'], start_new_session=True)\nimport time\nwhile True:\n    time.sleep(0.1)\n"
            f"    if open('{pid_file}').read().strip() if __import__('os').path.exists('{pid_file}') else '':\n"
            f"        break\n")
    result = job(tmp_path, code, limits.Limits(pids=64))
    assert result.status == "crash" and "val_bpb" in result.reason, result  # it exited 0 without a result
    pid = int(pid_file.read_text())
    until = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < until:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_the_flags_reach_the_run_settings(tmp_path):
    from click.testing import CliRunner

    from harness.cli import common as cli
    shown = CliRunner().invoke(cli.main, ["run", "--help"]).output
    for flag in ("--job-memory-mb", "--job-pids", "--job-disk-mb", "--job-log-mb", "--eval-kill-after"):
        assert flag in shown
    repo = make_repo(tmp_path / "r")
    cfg = cli.build_config(repo, "t", job_memory_mb=512, job_pids=7, job_disk_mb=0, job_log_mb=3,
                           eval_kill_after=9.0)
    assert (cfg.job_memory_mb, cfg.job_pids, cfg.job_disk_mb, cfg.job_log_mb, cfg.eval_kill_after) == (
        512, 7, 0, 3, 9.0)
    with pytest.raises(Exception, match="--job-pids.*integer >= 0"):
        cli.build_config(repo, "t", job_pids=-1)


MAKE_AND_WAIT = ("import sys, time\nfrom harness.executors import limits\n"
                 "group = limits.Cgroup.make(limits.Limits(memory_mb=64, pids=64))\n"
                 "print(*sorted({str(p) for p in group.dirs.values()}), flush=True)\ntime.sleep(120)\n")


@needs_cgroup
def test_a_killed_supervisors_job_cgroups_are_removed_by_the_next_harness_process(tmp_path):
    """A supervisor killed with SIGKILL never removes its jobs' cgroups; the next harness process
    removes them before it makes its first (once), and leaves a live one's alone."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    killed, live = (subprocess.Popen([PY, "-c", MAKE_AND_WAIT], stdout=subprocess.PIPE, text=True, env=env)
                    for _ in range(2))
    try:
        left, held = (proc.stdout.readline().split() for proc in (killed, live))
        killed.kill()
        killed.wait()
        assert left and all(Path(p).is_dir() for p in left)  # what a SIGKILL leaves
        done = subprocess.run([PY, "-c", "from harness.executors import limits\n"
                                         "limits.Cgroup.make(limits.Limits(memory_mb=64, pids=64)).remove()"],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert not any(Path(p).exists() for p in left)
        assert held and all(Path(p).is_dir() for p in held)  # its supervisor is alive
    finally:
        live.kill()
        live.wait()
    limits.sweep_stale(limits._own_paths())
    assert not any(Path(p).exists() for p in held)
