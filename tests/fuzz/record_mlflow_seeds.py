"""Usage: record_mlflow_seeds.py OUTPUT_DIR

Records the mlflow fuzz target's seeds (tests/fuzz/seeds/mlflow/) from a real MLflow server: PyPI's
mlflow, run by this script's Python on a free loopback port with a SQLite store, asked what dettrial
asks it (experiments/get-by-name, found and not, experiments/create, runs/create, runs/log-batch,
runs/update, an artifact upload); each answer's body is one seed file, named for its request and
status. Run it again with a newer mlflow to record that version's answers.
"""
import json
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

out = pathlib.Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
store = pathlib.Path(tempfile.mkdtemp(prefix="mlflow-seeds-"))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
server = subprocess.Popen(
    [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{store}/mlflow.db",
     "--artifacts-destination", str(store / "artifacts"), "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
base = f"http://127.0.0.1:{port}"


def ask(method, path, body=None, data=None, content_type="application/json"):
    if body is not None:
        data = json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


def record(name, method, path, body=None, **kw):
    status, text = ask(method, path, body, **kw)
    (out / f"{name}-{status}.json").write_bytes(text)
    return json.loads(text) if text else {}


try:
    for _ in range(600):
        try:
            if ask("GET", "/health")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    else:
        sys.exit("the MLflow server did not start")
    api = "/api/2.0/mlflow/"
    mlflow_version = ask("GET", "/version")[1].decode()
    record("experiments-get-by-name", "GET", api + "experiments/get-by-name?experiment_name=seeds")
    experiment = record("experiments-create", "POST", api + "experiments/create", {"name": "seeds"})["experiment_id"]
    record("experiments-create-again", "POST", api + "experiments/create", {"name": "seeds"})
    record("experiments-get-by-name", "GET", api + "experiments/get-by-name?experiment_name=seeds")
    run = record("runs-create", "POST", api + "runs/create",
                 {"experiment_id": experiment, "run_name": "seeds", "start_time": 1,
                  "tags": [{"key": "team", "value": "vision"}]})["run"]["info"]
    record("runs-log-batch", "POST", api + "runs/log-batch",
           {"run_id": run["run_id"], "metrics": [{"key": "loss", "value": 0.5, "timestamp": 1, "step": 10}]})
    record("runs-log-batch-refused", "POST", api + "runs/log-batch", {"run_id": "no-such-run", "metrics": []})
    artifacts = run["artifact_uri"].removeprefix("mlflow-artifacts:").lstrip("/")
    record("artifact-upload", "PUT", f"/api/2.0/mlflow-artifacts/artifacts/{artifacts}/config.yaml", data=b"name: seeds\n",
           content_type="application/octet-stream")
    record("runs-update", "POST", api + "runs/update", {"run_id": run["run_id"], "status": "FINISHED", "end_time": 2})
    print(f"ok: the answers of MLflow {mlflow_version} in {out}")
finally:
    server.terminate()
    server.wait()
