"""Usage: mlflow_server.py PROGRAM DATA_DIR OUTPUT_DIR [WHY_NO_GLOO]

Tracks the MNIST example in a real MLflow server (PyPI's mlflow, run by this script's Python: a
SQLite backend store, a local artifact root, a free loopback port) and reads everything back through
MLflow's REST API:
- a run, then a resume of it from its checkpoint at batch 20: one MLflow run, FINISHED, with the
  hyperparameters as params, every report's metrics at its batch once, the config as an artifact,
  checkpoint and system tags; metrics.csv holds the same numbers as metrics.jsonl;
- a two-rank run: one MLflow run (only the chief logs), unless WHY_NO_GLOO says why this build has none;
- a search of two trials: a parent run with the trials as nested runs, all FINISHED;
- MLflow's own UI shows the run: headless Chromium renders its page (its DOM names the run's params
  and metrics) and takes a screenshot, OUTPUT_DIR/mlflow-run.png (the one docs/observability.md shows);
- a run stopped by SIGTERM ends KILLED (exit 75); its resume continues the same run to FINISHED;
- a run whose server is killed mid-run: training finishes, one warning, the requests are kept in the
  run folder; the server comes back and --sync-mlflow sends them: the history is complete, FINISHED.
Exit 77 (skipped) without mlflow.
"""
import csv
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

try:
    import mlflow  # noqa: F401 (only its server is used: the checks speak REST)
except ImportError:
    print("skipped: this Python has no mlflow package (scripts/test installs PyPI's mlflow)")
    sys.exit(77)

program, data, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
no_gloo = sys.argv[4] if len(sys.argv) > 4 else ""
shutil.rmtree(out, ignore_errors=True)
out.mkdir(parents=True)
CONFIG = """name: mlflow-mnist
hyperparameters: {learning_rate: 0.05, dropout: 0.2, global_batch_size: 64, n_filters1: 8, n_filters2: 16, nested: {a: 1, b: x}}
reproducibility: {experiment_seed: 7}
scheduling_unit: 10
min_validation_period: {batches: 20}
min_checkpoint_period: {batches: 20}
checkpoint_storage: {save_trial_best: 0, save_trial_latest: 5}
searcher: {name: single, metric: validation_loss, max_length: {batches: 40}}
data: {train_split: t10k, validation_split: t10k, holdout: 1000}
mlflow: {tags: {team: vision}}
"""
(out / "run.yaml").write_text(CONFIG)


def fail(message):
    print(f"mlflow: {message}")
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


port = free_port()
uri = f"http://127.0.0.1:{port}"
server = None


def start_server():
    global server
    log = open(out / "server.log", "a")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{out}/mlflow.db",
         "--artifacts-destination", str(out / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        if server.poll() is not None:
            fail("the server exited: " + (out / "server.log").read_text()[-2000:])
        time.sleep(0.2)
    fail("the server did not answer in 120 s")


def kill_server():
    os.killpg(server.pid, signal.SIGKILL)
    server.wait()


def rest(api, body=None, method=None):
    url = f"{uri}/api/2.0/mlflow/{api}"
    if body is not None and method == "GET":
        url += "?" + urllib.parse.urlencode(body)
        body = None
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method=method or ("POST" if body else "GET"))
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read() or b"{}")


def runs_of(experiment):
    eid = rest("experiments/get-by-name", {"experiment_name": experiment}, "GET")["experiment"]["experiment_id"]
    return rest("runs/search", {"experiment_ids": [eid], "max_results": 100})["runs"]


def history(run_id, key):
    points = rest("metrics/get-history", {"run_id": run_id, "metric_key": key, "max_results": 10000}, "GET").get("metrics", [])
    return sorted((p["step"], p["value"]) for p in points)


def tags_of(run):
    return {t["key"]: t["value"] for t in run["data"].get("tags", [])}


def train(*args, env_extra=None, log=None, check=True):
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri, **(env_extra or {}))
    with open(log, "w") as f:
        status = subprocess.run([program, *args, "--set", f"data.dir={data}"], env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    text = pathlib.Path(log).read_text()
    print(text[-3000:])
    if check and status != 0:
        fail(f"{' '.join(args)} exited with {status}")
    return text


def records(run_dir, kind):
    lines = (json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r for r in lines if r["type"] == kind]


def same_history(run_id, run_dir, kind, prefix):
    expected = records(run_dir, kind)
    for name in expected[-1]["metrics"]:
        if name in ("batches", "epochs"):
            continue
        got = history(run_id, prefix + name)
        want = [(r["batches"], r["metrics"][name]) for r in expected if r["metrics"].get(name) is not None]
        if [s for s, _ in got] != [s for s, _ in want]:
            fail(f"{prefix}{name}: MLflow has steps {[s for s, _ in got]}, metrics.jsonl {[s for s, _ in want]}")
        for (step, a), (_, b) in zip(got, want):
            if abs(a - b) > 1e-6 * max(1.0, abs(b)):
                fail(f"{prefix}{name} at batch {step}: MLflow {a}, metrics.jsonl {b}")


def browser():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def screenshot(run):
    """MLflow's UI for `run`, rendered by headless Chromium: its DOM, then a screenshot."""
    chromium = browser()
    if not chromium:
        print("not run here: MLflow's UI in a browser (no Chromium on the PATH)")
        return
    url = f"{uri}/#/experiments/{run['info']['experiment_id']}/runs/{run['info']['run_id']}"
    common = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
              f"--user-data-dir={out / 'chromium'}", "--virtual-time-budget=20000", "--window-size=1400,1000"]
    png = out / "mlflow-run.png"
    # One launch: headless Chromium prints the DOM and then takes the screenshot of the same page.
    dom = subprocess.run(common + ["--dump-dom", f"--screenshot={png}", url], capture_output=True, text=True, timeout=180).stdout
    for needle in ("learning_rate", "n_filters1", "train/loss", "FINISHED".lower()):
        if needle not in dom.lower():
            fail(f"MLflow's run page does not show {needle} ({len(dom)} bytes of DOM)")
    if not png.exists() or png.stat().st_size < 20000:
        fail(f"no screenshot of MLflow's run page ({png})")
    print(f"ok: MLflow's UI shows the run ({png})")


def two_ranks():
    (out / "ddp.yaml").write_text(CONFIG.replace("name: mlflow-mnist", "name: mlflow-ddp") + "resources: {slots_per_trial: 2}\n")
    train("--config", str(out / "ddp.yaml"), "--output", str(out / "ddp"), log=out / "ddp.log")
    runs = runs_of("mlflow-ddp")
    if len(runs) != 1 or runs[0]["info"]["status"] != "FINISHED" or tags_of(runs[0]).get("dettrial.ranks") != "2":
        fail(f"the two-rank run made {[(r['info']['status'], tags_of(r).get('dettrial.ranks')) for r in runs]}")
    same_history(runs[0]["info"]["run_id"], out / "ddp", "training", "train/")
    print("ok: a two-rank run is one MLflow run")


start_server()
try:
    # 1. A run, then its resume from the checkpoint at batch 20 (batches 21-40 are trained again).
    run_dir = out / "run"
    train("--config", str(out / "run.yaml"), "--output", str(run_dir), log=out / "run.log")
    run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    checkpoint = next(p.parent for p in (run_dir / "checkpoints").glob("*/metadata.json") if '"steps_completed": 20,' in p.read_text())
    train("--config", str(out / "run.yaml"), "--set", "searcher.max_length.batches=50", "--resume", str(checkpoint), "--output", str(run_dir),
          log=out / "resume.log")
    runs = runs_of("mlflow-mnist")
    if len(runs) != 1:
        fail(f"the run and its resume made {len(runs)} MLflow runs, not one")
    run = runs[0]
    if run["info"]["run_id"] != run_id or run["info"]["status"] != "FINISHED":
        fail(f"the MLflow run is {run['info']['run_id']} ({run['info']['status']}), not {run_id} FINISHED")
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    want = {"learning_rate": "0.05", "dropout": "0.2", "global_batch_size": "64", "n_filters1": "8", "nested.a": "1", "nested.b": "x"}
    if any(params.get(k) != v for k, v in want.items()):
        fail(f"params {params}, expected {want}")
    tags = tags_of(run)
    for key in ("team", "dettrial.system", "dettrial.checkpoint.latest", "dettrial.checkpoint.batch_20", "dettrial.learning_rates"):
        if key not in tags:
            fail(f"no tag {key} in {sorted(tags)}")
    if tags["team"] != "vision" or not (run_dir / "checkpoints" / tags["dettrial.checkpoint.latest"]).is_dir():
        fail(f"tags {tags}")
    same_history(run_id, run_dir, "training", "train/")
    same_history(run_id, run_dir, "validation", "validation/")
    if [s for s, _ in history(run_id, "train/loss")] != [10, 20, 30, 40, 50]:
        fail(f"train/loss steps {history(run_id, 'train/loss')}")
    artifacts = rest("artifacts/list", {"run_id": run_id}, "GET").get("files", [])
    if "config.yaml" not in [a["path"] for a in artifacts]:
        fail(f"artifacts {artifacts}")
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    training = [r for r in rows if r["type"] == "training"]
    if [int(r["batches"]) for r in training] != [10, 20, 30, 40, 50] or abs(float(training[-1]["loss"]) - records(run_dir, "training")[-1]["metrics"]["loss"]) > 1e-6:
        fail(f"metrics.csv rows {rows}")
    screenshot(run)
    print(f"ok: a run and its resume are one MLflow run: {len(params)} params, train/loss at {[s for s, _ in history(run_id, 'train/loss')]}")

    # 2. Two ranks: only the chief logs.
    if no_gloo:
        print(f"not run here: the two-rank run ({no_gloo})")
    else:
        two_ranks()

    # 3. A search: its parent run, and its trials nested.
    search = CONFIG.replace("name: mlflow-mnist", "name: mlflow-search").replace(
        "searcher: {name: single, metric: validation_loss, max_length: {batches: 40}}",
        "searcher: {name: random, metric: validation_loss, max_trials: 2, max_length: {batches: 20}}").replace(
        "learning_rate: 0.05", "learning_rate: {type: double, minval: 0.01, maxval: 0.1}")
    (out / "search.yaml").write_text(search)
    train("--config", str(out / "search.yaml"), "--output", str(out / "search"), log=out / "search.log")
    runs = runs_of("mlflow-search")
    parents = [r for r in runs if "mlflow.parentRunId" not in tags_of(r)]
    children = [r for r in runs if "mlflow.parentRunId" in tags_of(r)]
    if len(parents) != 1 or len(children) != 2 or any(tags_of(c)["mlflow.parentRunId"] != parents[0]["info"]["run_id"] for c in children):
        fail(f"the search made {len(parents)} parent run(s) and {len(children)} nested")
    if any(r["info"]["status"] != "FINISHED" for r in runs):
        fail(f"statuses {[r['info']['status'] for r in runs]}")
    for child in children:
        lr = {p["key"]: p["value"] for p in child["data"]["params"]}["learning_rate"]
        if not 0.01 <= float(lr) <= 0.1:
            fail(f"a trial's learning_rate param is {lr}")
    print("ok: a search is a parent MLflow run with its 2 trials nested")

    # 4. A stop by SIGTERM: KILLED, then resumed to FINISHED in the same MLflow run.
    stop_dir = out / "stopped"
    (out / "stop.yaml").write_text(CONFIG.replace("name: mlflow-mnist", "name: mlflow-stop").replace("batches: 40}}", "batches: 5000}}"))
    with open(out / "stop.log", "w") as f:
        stopped = subprocess.Popen([program, "--config", str(out / "stop.yaml"), "--output", str(stop_dir), "--threads", "1",
                                    "--set", f"data.dir={data}"], env=dict(os.environ, MLFLOW_TRACKING_URI=uri), stdout=f,
                                   stderr=subprocess.STDOUT)
    while stopped.poll() is None and not ((stop_dir / "metrics.jsonl").exists() and records(stop_dir, "training")):
        time.sleep(0.05)
    stopped.send_signal(signal.SIGTERM)
    if stopped.wait() != 75:
        fail(f"the run stopped by SIGTERM exited with {stopped.returncode}, not 75: " + (out / "stop.log").read_text()[-2000:])
    runs = runs_of("mlflow-stop")
    if len(runs) != 1 or runs[0]["info"]["status"] != "KILLED":
        fail(f"the stopped run is {[r['info']['status'] for r in runs]} in MLflow, not KILLED")
    stopped_at = records(stop_dir, "checkpoint")[-1]["batches"]
    train("--resume", str(stop_dir), "--set", f"searcher.max_length.batches={stopped_at + 30}", log=out / "stop-resume.log")
    runs = runs_of("mlflow-stop")
    if len(runs) != 1 or runs[0]["info"]["status"] != "FINISHED":
        fail(f"the resumed run is {[r['info']['status'] for r in runs]} in MLflow, not one FINISHED run")
    same_history(runs[0]["info"]["run_id"], stop_dir, "training", "train/")
    print(f"ok: a run stopped by SIGTERM at batch {stopped_at} is KILLED in MLflow, and FINISHED once resumed")

    # 5. The server dies mid-run: training finishes; the requests are kept, then synced.
    dead_dir = out / "dead"
    (out / "dead.yaml").write_text(CONFIG.replace("name: mlflow-mnist", "name: mlflow-dead").replace("batches: 40}}", "batches: 600}}"))
    env = dict(os.environ, MLFLOW_TRACKING_URI=uri)
    with open(out / "dead.log", "w") as f:
        trainer = subprocess.Popen([program, "--config", str(out / "dead.yaml"), "--output", str(dead_dir), "--threads", "1",
                                    "--set", f"data.dir={data}"], env=env, stdout=f, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline and trainer.poll() is None:
        if (dead_dir / "metrics.jsonl").exists() and len(records(dead_dir, "training")) >= 2:
            break
        time.sleep(0.05)
    kill_server()
    status = trainer.wait()
    log = (out / "dead.log").read_text()
    print(log[-3000:])
    if status != 0:
        fail(f"the run whose server died exited with {status}")
    if log.count("the MLflow server does not answer") != 1:
        fail("not one warning that the server does not answer")
    if not (dead_dir / "mlflow-pending.jsonl").exists():
        fail("no pending requests kept")
    start_server()
    with open(out / "sync.log", "w") as f:
        status = subprocess.run([program, "--sync-mlflow", str(dead_dir)], stdout=f, stderr=subprocess.STDOUT).returncode
    print((out / "sync.log").read_text())
    if status != 0:
        fail(f"--sync-mlflow exited with {status}")
    if (dead_dir / "mlflow-pending.jsonl").exists():
        fail("requests are still pending after --sync-mlflow")
    runs = runs_of("mlflow-dead")
    if len(runs) != 1 or runs[0]["info"]["status"] != "FINISHED":
        fail(f"after the sync: {[(r['info']['status']) for r in runs]}")
    same_history(runs[0]["info"]["run_id"], dead_dir, "training", "train/")
    same_history(runs[0]["info"]["run_id"], dead_dir, "validation", "validation/")
    print(f"ok: a dead server cost no training and lost no metrics ({len(records(dead_dir, 'training'))} training reports synced)")
finally:
    if server and server.poll() is None:
        kill_server()
print("ok: runs, a resume, two ranks, a search and a dead server, read back from MLflow's REST API")
