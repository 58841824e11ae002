#!/usr/bin/env bash
# Usage: records.sh PROGRAM CONFIG_DIR WORK_DIR
# How a search runner continuing an experiment reads Slurm's job records, with stand-ins for srun
# (runs the trial here), scancel and scontrol (prints a job list this script writes), so that it
# needs no cluster and every case is exact:
# - a job cancelled while queued (JobState=CANCELLED, ExitCode=0:0) is a failure, not a completion:
#   the trial is restarted from its checkpoint;
# - a job whose end the event log already records (a restart logged, the runner killed before the
#   next job started) is not ended a second time;
# - a torn last line of events.jsonl (a runner killed while writing it) is dropped, and the events
#   written after it are kept.
set -u
program=$1 configs=$2 work=$3
fail() { echo "records: $*"; exit 1; }
rm -rf "$work"
mkdir -p "$work/bin"
cat >"$work/bin/srun" <<'SH'
#!/bin/sh
# srun's options dropped; the trial runs here.
while [ $# -gt 0 ]; do case $1 in --*) shift ;; *) break ;; esac; done
exec "$@"
SH
printf '#!/bin/sh\nexit 0\n' >"$work/bin/scancel"
printf '#!/bin/sh\ncat "$FAKE_SLURM_JOBS" 2>/dev/null\n' >"$work/bin/scontrol"
chmod +x "$work/bin/"*
export PATH="$work/bin:$PATH" FAKE_SLURM_JOBS="$work/jobs.txt"
: >"$work/jobs.txt"
search=(--config "$configs/random.yaml" --set searcher.max_length.batches=64 --set data.batch_sleep_ms=50
        --set min_checkpoint_period.batches=8 --output "$work/exp" --launcher slurm)

# A runner killed (SIGKILL) once trials 1 and 2 have checkpoints; their processes are killed too.
"$program" "${search[@]}" >"$work/first.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do
  ls "$work"/exp/trials/{1,2}/checkpoints/*/metadata.json >/dev/null 2>&1 && break
  sleep 0.1
done
kill -KILL "$pid"
wait "$pid" 2>/dev/null
pkill -KILL -f "$work/exp/trials/" 
sleep 0.5
id=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"])' "$work/exp/experiment.json")
grep -q '"event":"end"' "$work/exp/events.jsonl" && fail "a trial ended before the runner was killed: $(cat "$work/first.log")"

# What the next runner finds: trial 1's failed job 7, whose restart the log records; trial 2's job 8,
# cancelled while queued; a torn event at the end of the log.
echo '{"event":"restart","trial":1,"restarts":1,"slurm_job":7}' >>"$work/exp/events.jsonl"
printf '{"event":"validation","tri' >>"$work/exp/events.jsonl"
cat >"$work/jobs.txt" <<JOBS
JobId=7 JobName=dettrial-e$id-t1 UserId=root(0) Priority=1 JobState=FAILED Reason=NonZeroExitCode Restarts=0 ExitCode=1:0
JobId=8 JobName=dettrial-e$id-t2 UserId=root(0) Priority=1 JobState=CANCELLED Reason=None Restarts=0 ExitCode=0:0 DerivedExitCode=0:0
JobId=9 JobName=another-job UserId=root(0) JobState=RUNNING ExitCode=0:0
JOBS
"$program" "${search[@]}" >"$work/second.log" 2>&1
status=$?
cat "$work/second.log"
[ "$status" -eq 0 ] || fail "the continued search exited with $status"
grep -q "the last line of .*events.jsonl was torn" "$work/second.log" || fail "the torn event was not reported"
grep -q "trial 1's Slurm job 7" "$work/second.log" && fail "trial 1's job 7, whose restart the log records, was ended again"
grep -q "trial 2's Slurm job 8 ended while no runner watched it (CANCELLED)" "$work/second.log" || fail "trial 2's cancelled job was not read"
grep -q "trial 2 failed (killed by signal 15.*restart 1 of" "$work/second.log" || fail "trial 2's cancelled job was not a failure"
python3 - "$work/exp" <<'PY' || fail "bad summary or event log"
import json, sys
d = sys.argv[1]
events = [json.loads(line) for line in open(d + "/events.jsonl")]  # every line whole
s = json.load(open(d + "/summary.json"))
t = {x["id"]: x for x in s["trials"]}
assert [t[i]["restarts"] for i in (1, 2, 3, 4)] == [1, 1, 0, 0], t
assert all(x["state"] == "COMPLETED" and x["batches_trained"] == 64 for x in t.values()), t
print("ok:", len(events), "events, restarts", [t[i]["restarts"] for i in (1, 2, 3, 4)])
PY
echo "ok: a cancelled queued job is a failure, a handled job is not ended twice, a torn event is dropped"
