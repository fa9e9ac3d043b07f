"""Experiment tracking against a real MLflow: a tracking server on 127.0.0.1, or the sqlite default.

Runs are driven the way a user drives them (`harness run --agent mutate --track ...` on the fake
trainer), then read back with MlflowClient.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from harness.ledger import events
from harness import ledger
from harness.cli import main
from harness.track.records import build

from conftest import FAKE_TRAIN, ROOT, make_repo

READY_S = 120  # s a server may take to start on a busy machine
# The fake trainer also prints what the harness told it about its run.
ENV_TRAIN = FAKE_TRAIN.replace(
    'print(f"fake training,',
    'print("env", *(f"{k}={os.environ.get(k, \'-\')}" for k in ("HARNESS_RUN", "HARNESS_ITERATION", '
    '"HARNESS_COMMIT", "HARNESS_TRACKING_URI")))\nprint(f"fake training,')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`mlflow server` on 127.0.0.1 with a sqlite store; stop() and start() keep its port and data."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{self.root / 'store.db'}",
               "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1"]
        log = open(self.root / "server.log", "a")
        self.proc = subprocess.Popen(cmd, cwd=self.root, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / "server.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(self.uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise AssertionError(f"mlflow server not ready after {READY_S}s")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)


@pytest.fixture
def server(tmp_path: Path):
    root = tmp_path / "mlflow-server"
    root.mkdir()
    srv = Server(root)
    srv.start()
    yield srv
    srv.stop()


def harness(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def tracked(uri: str, tag: str) -> dict[int, object]:
    """The experiment's row runs by ledger row index (a duplicate fails the test)."""
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(tag)
    assert exp is not None, f"no experiment {tag!r} at {uri}"
    runs = [r for r in client.search_runs([exp.experiment_id], max_results=1000) if "harness.row" in r.data.tags]
    by_row = {int(r.data.tags["harness.row"]): r for r in runs}
    assert len(by_row) == len(runs), "a ledger row was logged twice"
    return by_row


def check_figures(uri: str, run_dir: Path, tag: str) -> dict[int, object]:
    """Every ledger row is one MLflow run with the ledger's figures."""
    rows = ledger.read_rows(run_dir / "results.tsv")
    runs = tracked(uri, tag)
    assert sorted(runs) == list(range(len(rows)))
    client = MlflowClient(tracking_uri=uri)
    for i, row in enumerate(rows):
        run = runs[i]
        m, p, t = run.data.metrics, run.data.params, run.data.tags
        assert t["status"] == row["status"] and t["commit"] == row["commit"] and t["sealed"] == (row["sealed"] or "")
        assert p["iteration"] == str(row["iteration"]) and p["agent"] == row["agent"]
        value = row["metric"] if row["status"] == "repeat" else ledger.decided_value(row)  # a keep's mean
        assert m.get("val_bpb") == (pytest.approx(value) if value is not None else None)
        for name in ("memory_gb", "train_s", "agent_s", "input_tokens", "cached_tokens", "output_tokens", "cost_usd"):
            assert m.get(name) == (None if row[name] is None else pytest.approx(row[name])), name
        assert run.info.status == ("FAILED" if row["status"] in ("crash", "timeout") else "FINISHED")
        names = {a.path for a in client.list_artifacts(run.info.run_id, "logs")}
        if row["status"] == "repeat":
            candidate = next(j for j in range(i) if rows[j]["iteration"] == row["candidate"]
                             and rows[j]["status"] != "repeat")
            assert t["mlflow.parentRunId"] == runs[candidate].info.run_id
            assert f"logs/{Path(row['log']).name}" in names
        elif row["iteration"] > 0:
            assert p["description"] == row["description"] and p["parent"] == row["parent"]
            logs = [f"iter-{row['iteration']:04d}.log", f"iter-{row['iteration']:04d}-agent.log"]
            assert {f"logs/{n}" for n in logs if (run_dir / "logs" / n).exists()} <= names
            if row["train_s"] is not None:
                assert f"logs/{logs[0]}" in names
            if row["commit"] and row["status"] != "skip":
                diff = client.download_artifacts(run.info.run_id, "diff.patch", str(run_dir.parent / f"dl-{i}"))
                assert "+++ b/train.py" in Path(diff).read_text()
    return runs


def test_every_row_is_a_run_on_a_tracking_server(tmp_path: Path, server: Server):
    repo = make_repo(tmp_path / "r", train_source=ENV_TRAIN)
    out = harness("run", "--repo", str(repo), "--tag", "night", "--agent", "mutate", "--iterations", "4",
                  "--track", f"mlflow:{server.uri}")
    assert "tracked: " in out
    run_dir = repo / "runs/night"
    runs = check_figures(server.uri, run_dir, "night")
    rows = ledger.read_rows(run_dir / "results.tsv")
    assert any(r["status"] == "repeat" for r in rows)  # the baseline's second run: a child run
    # The best so far: one history stepped by iteration, and on each candidate's run.
    client = MlflowClient(tracking_uri=server.uri)
    exp = client.get_experiment_by_name("night")
    progress = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags.get("harness.key") == "night/progress"]
    history = {h.step: h.value for h in client.get_metric_history(progress[0].info.run_id, "best_val_bpb")}
    assert sorted(history) == list(range(5))
    best = None
    for i, row in enumerate(rows):
        if row["status"] == "keep":
            best = ledger.decided_value(row)
        if row["status"] != "repeat":
            assert history[row["iteration"]] == pytest.approx(best)
            assert runs[i].data.metrics["best_val_bpb"] == pytest.approx(best)
    # The training job knew its run, iteration, commit and the tracker.
    log = (run_dir / "logs/iter-0002.log").read_text()
    env = dict(part.split("=", 1) for part in log.split("\n", 1)[0].split()[1:])
    assert env["HARNESS_RUN"] == "night" and env["HARNESS_ITERATION"] == "2"
    assert env["HARNESS_COMMIT"].startswith(rows[[r["iteration"] for r in rows].index(2)]["commit"])
    assert len(env["HARNESS_COMMIT"]) == 40 and env["HARNESS_TRACKING_URI"] == server.uri
    # Syncing again logs nothing twice.
    assert "0 new of" in harness("track", str(run_dir), "--uri", server.uri)
    assert len(tracked(server.uri, "night")) == len(rows)


def test_server_killed_mid_run_then_back_filled(tmp_path: Path, server: Server):
    """The tracker dies while the run goes on: no crash, no lost row; `harness track` completes it."""
    source = ENV_TRAIN.replace("SLEEP_S = 0.0", "SLEEP_S = 0.5")
    repo = make_repo(tmp_path / "r", train_source=source, extra="track_timeout = 5\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
           "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    cmd = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", "k", "--agent", "mutate",
           "--iterations", "6", "--baseline-runs", "1", "--track", f"mlflow:{server.uri}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = repo / "runs/k"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        try:  # wait until the tracker holds some of the run
            if len(tracked(server.uri, "k")) >= 2:
                break
        except AssertionError:
            pass
        time.sleep(0.2)
    server.stop(signal.SIGKILL)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    rows = ledger.read_rows(run_dir / "results.tsv")
    assert max(r["iteration"] for r in rows) == 6  # the night went on without its tracker
    kinds = [e["kind"] for e in events.read(run_dir)[0]]
    assert "tracking_failed" in kinds and "tracking_incomplete" in kinds
    assert "tracking incomplete" in err and "harness track" in " ".join(err.split())
    server.start()
    assert len(tracked(server.uri, "k")) < len(rows)
    out = harness("track", str(run_dir))  # the run's own track_uri
    assert f"of {len(rows)} rows" in out
    check_figures(server.uri, run_dir, "k")
    assert "0 new of" in harness("track", str(run_dir))


def test_sqlite_default_without_a_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`track = "mlflow"` in [tool.harness]: one local file, runs/mlflow.db, and no server."""
    repo = make_repo(tmp_path / "r", extra='track = "mlflow"\n')
    monkeypatch.chdir(tmp_path)  # artifacts must go beside the store, not into the cwd
    harness("run", "--repo", str(repo), "--tag", "local", "--agent", "mutate", "--iterations", "3")
    uri = f"sqlite:///{repo / 'runs/mlflow.db'}"
    check_figures(uri, repo / "runs/local", "local")
    assert (repo / "runs/mlflow-artifacts/local").is_dir() and not (tmp_path / "mlruns").exists()
    # A run made without tracking is back-filled into the same store; twice is once.
    harness("run", "--repo", str(repo), "--tag", "later", "--agent", "mutate", "--iterations", "2", "--track", "none")
    n = len(ledger.read_rows(repo / "runs/later/results.tsv"))
    assert f"{n} new of {n} rows" in " ".join(harness("track", str(repo / "runs/later")).split())
    assert f"0 new of {n} rows" in " ".join(harness("track", str(repo / "runs/later")).split())
    check_figures(uri, repo / "runs/later", "later")


CONFIRMED = """import json, re, sys
path = sys.argv[1] + "/train.py"
src = open(path).read()
open(path, "w").write(re.sub(r"^VALUE = .*$", "VALUE = 0.5", src, count=1, flags=re.M))
print(json.dumps({"input_tokens": 10, "output_tokens": 5, "description": "VALUE to 0.5"}))
"""


def test_a_confirmed_keep_is_one_value_in_the_run_status_json_and_the_tracker(tmp_path: Path, monkeypatch):
    """A win confirmed by two more runs: its value is the mean the ledger and the best use, with
    the runs behind it, wherever it is shown; never its first run's value."""
    import json

    repo = make_repo(tmp_path / "r", extra='track = "mlflow"\n')
    monkeypatch.setenv("FAKE_NOISE", "0.01")
    monkeypatch.setenv("FAKE_COUNTER", str(tmp_path / "counter"))
    (tmp_path / "researcher.py").write_text(CONFIRMED)
    out = harness("run", "--repo", str(repo), "--tag", "k", "--agent", f"cmd:{sys.executable} "
                  f"{tmp_path / 'researcher.py'} {{workdir}}", "--iterations", "2", "--baseline-runs", "2",
                  "--confirm", "2")
    rows = ledger.read_rows(repo / "runs/k/results.tsv")
    keep = next(r for r in rows if r["iteration"] == 1 and r["status"] == "keep")
    runs = [keep["metric"]] + [r["metric"] for r in rows if r["status"] == "repeat" and r["candidate"] == 1]
    mean = sum(runs) / 3
    assert keep["runs"] == 3 and keep["mean"] == pytest.approx(mean, abs=1e-6)
    assert f"{keep['metric']:.6f}" != f"{mean:.6f}"  # the noise makes the first run differ from the mean
    line = next(line for line in out.splitlines() if line.lstrip().startswith("1 keep"))
    assert f"{keep['mean']:.6f}" in line and f"{keep['metric']:.6f}" not in line  # `harness run`'s own row line
    state = json.loads(harness("status", "k", "--repo", str(repo), "--json"))
    shown = next(r for r in state["last_rows"] if r["iteration"] == 1 and r["status"] == "keep")
    assert shown["metric"] == pytest.approx(keep["mean"]) == pytest.approx(state["figures"]["best"])
    assert shown["runs"] == 3 and shown["run_values"] == pytest.approx(runs) and state["figures"]["best_runs"] == 3
    assert shown["first_run"] == pytest.approx(keep["metric"])
    text = harness("status", "k", "--repo", str(repo), "--width", "100")
    row_line = next(line for line in text.splitlines() if line.startswith("   1 "))
    assert f"{keep['mean']:.6f} keep×3" in row_line, text
    assert f"{keep['metric']:.6f}" not in text
    assert f"best:          {keep['mean']:.6f} (3 runs)" in text
    prompt = (repo / "runs/k/logs/iter-0002-prompt.md").read_text()  # what the next researcher is told
    assert f"Current best val_bpb: {keep['mean']:.6f}" in prompt and f"{keep['metric']:.6f}" not in prompt
    run = tracked(f"sqlite:///{repo / 'runs/mlflow.db'}", "k")[rows.index(keep)]
    assert run.data.metrics["val_bpb"] == pytest.approx(keep["mean"], abs=1e-6)
    assert run.data.metrics["first_run"] == pytest.approx(keep["metric"]) and run.data.metrics["runs"] == 3


def black_hole() -> tuple[socket.socket, int]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers: a hung tracker."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(sock.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    return sock, sock.getsockname()[1]


def test_a_hung_tracker_never_holds_the_run_up(tmp_path: Path):
    sock, port = black_hole()
    try:
        repo = make_repo(tmp_path / "r", extra="track_timeout = 2\n")
        env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_HTTP_REQUEST_TIMEOUT": "600"}
        cmd = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", "h", "--agent", "mutate",
               "--iterations", "3", "--track", f"mlflow:http://127.0.0.1:{port}"]
        start = time.monotonic()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        took = time.monotonic() - start
    finally:
        sock.close()
    assert done.returncode == 0, done.stderr
    assert took < 200  # each request would hang for 600 s
    rows = ledger.read_rows(repo / "runs/h/results.tsv")
    assert max(r["iteration"] for r in rows) == 3
    incomplete = [e for e in events.read(repo / "runs/h")[0] if e["kind"] == "tracking_incomplete"]
    assert incomplete and "did not finish within 2s" in incomplete[0]["message"]


@pytest.mark.parametrize("spec, message", [
    ("wandb", "--track must be one of mlflow"),
    ("mlflow:", "needs a URI after the colon"),
])
def test_bad_track_settings_say_what_to_do(tmp_path: Path, spec: str, message: str):
    repo = make_repo(tmp_path / "r")
    result = CliRunner().invoke(main, ["run", "--repo", str(repo), "--tag", "x", "--iterations", "1",
                                       "--track", spec], catch_exceptions=False)
    assert result.exit_code != 0 and message in result.output
    assert not (repo / "runs/x").exists()


def test_ab_arms_are_experiments_and_the_ab_folder_back_fills(tmp_path: Path):
    repo = make_repo(tmp_path / "r")
    result = CliRunner().invoke(main, ["ab", "--repo", str(repo), "--tag", "duel", "--agent", "mutate",
                                       "--iterations", "2", "--track", "mlflow"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(repo / "runs/duel/report.md")  # stdout stays the data channel
    uri = f"sqlite:///{repo / 'runs/mlflow.db'}"
    for arm in "ab":
        runs = check_figures(uri, repo / "runs/duel" / arm, f"duel-{arm}")
        assert {r.data.params["arm"] for r in runs.values()} == {arm}
    out = " ".join(harness("track", str(repo / "runs/duel")).split())
    assert out.count("0 new of") == 2


def test_records_keys_parents_and_best_so_far(tmp_path: Path):
    """Pure: lanes finish out of order, a health re-run repeats an older best, a budget row ends it."""
    def row(status, it, metric=None, **kw):
        return {"status": status, "iteration": it, "metric": metric, "commit": kw.pop("commit", f"c{it}"),
                "parent": kw.pop("parent", "c0"), "description": f"row {it}", **kw}

    rows = [row("keep", 0, 1.0, parent=""), row("repeat", 0, 1.01, candidate=0, seed=43),
            row("discard", 2, 1.2), row("keep", 1, 0.9, mean=0.91), row("repeat", 1, 0.92, candidate=1, seed=43),
            row("crash", 3), row("repeat", 1, 0.93, candidate=1, seed=1004), row("budget", 4, commit="c1")]
    recs = build(rows, "n", "val_bpb", tmp_path)
    assert [r.key for r in recs] == [f"n/{i}" for i in range(8)]
    assert [r.parent_key for r in recs] == [None, "n/0", None, None, "n/3", None, "n/3", None]
    assert [r.best for r in recs] == [1.0, None, 1.0, 0.91, None, 0.91, None, 0.91]  # the decided (mean) value
    assert [r.step for r in recs] == [0, 0, 2, 1, 1, 3, 1, 4]
    assert recs[5].failed and not recs[2].failed and "val_bpb" not in recs[5].metrics
    assert recs[2].diff == ("c0", "c2") and recs[0].diff is None and recs[7].diff is None


def test_a_back_fill_during_the_live_sync_logs_nothing_twice(tmp_path: Path):
    source = FAKE_TRAIN.replace("SLEEP_S = 0.0", "SLEEP_S = 0.3")
    repo = make_repo(tmp_path / "r", train_source=source, extra='track = "mlflow"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "harness", "run", "--repo", str(repo), "--tag", "both", "--agent", "mutate",
           "--iterations", "5", "--baseline-runs", "1"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir, syncs = repo / "runs/both", 0
    while proc.poll() is None:
        if (run_dir / "results.tsv").exists() and (run_dir / "run.json").exists():
            harness("track", str(run_dir))
            syncs += 1
        time.sleep(0.1)
    assert proc.returncode == 0, proc.communicate()[1]
    assert syncs >= 1  # at least one back-fill ran beside the live sync (the run trains for seconds)
    check_figures(f"sqlite:///{repo / 'runs/mlflow.db'}", run_dir, "both")


FIRST_USE = """
import sys, time
from pathlib import Path
import mlflow.tracking  # imported before the start line: the processes reach the database together
from harness.track import connect
Path(sys.argv[2] + "." + sys.argv[4]).touch()  # ready
while not Path(sys.argv[2]).exists():
    time.sleep(0.005)
connect("mlflow", sys.argv[1], Path(sys.argv[3])).open(sys.argv[4])
"""


def test_processes_that_create_one_local_database_at_once_take_turns(tmp_path: Path):
    """Two A/B arms' syncs, or a run's live sync and a back-fill, reaching a new runs/mlflow.db at
    the same moment: each opens its experiment; none reads a table another is still migrating."""
    script, go = tmp_path / "first_use.py", tmp_path / "go"
    script.write_text(FIRST_USE)
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    arms = [f"arm-{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, str(script), uri, str(go), str(tmp_path), arm], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for arm in arms]
    try:
        while any(p.poll() is None for p in procs) and not all(Path(f"{go}.{arm}").exists() for arm in arms):
            time.sleep(0.05)
        go.touch()
        results = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0, 0, 0], [err[-2000:] for _, err in results]
    client = MlflowClient(tracking_uri=uri)
    assert {e.name for e in client.search_experiments()} >= set(arms)
