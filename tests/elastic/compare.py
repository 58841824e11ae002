#!/usr/bin/env python3
"""Usage: compare.py REFERENCE_RUN RUN [RANKS_BEFORE>RANKS ...]

Checks a run that was resumed or restarted (RUN) against the same trial trained without a break
(REFERENCE_RUN), from the record indices each rank logged per batch (records/rank<R>.txt: attempt,
batch, a generator draw, record indices) and RUN's metrics.jsonl:

- RUN logged one `restart` record per restart or resume, with the rank counts given (in order), and
  its report.html names each (batch, restart or resume, both rank counts), and it holds
  no training, validation or checkpoint record twice (what a failed attempt logged after the
  checkpoint its successor resumed from is dropped);
- each attempt of RUN trained each of its batches once on each rank, starting at the batch of the
  checkpoint it resumed from;
- taking each batch from the last attempt that trained it, every global batch holds exactly the
  records, in the same order (ranks in rank order), as the reference's, and none is missing;
- the ranks of a job drew different numbers from their generators at each batch (their own streams,
  also on ranks the checkpoint did not have);
- where both the reference and RUN shared every global batch from RUN's first resume on evenly
  among their ranks (each rank's batch of one size), each update averages the same records with
  equal weights, so RUN's last validation loss equals the reference's within 1e-5 (relative): the
  optimizer's state came back whole (without SGD's momentum it is 2% off). Where one of them
  shared a short global batch unevenly (an epoch's end: 3 records on 2 ranks, or 5 on 3), its mean
  of the ranks' means weighs records unequally, as Determined's averaging does, and the other's
  does not, so the losses may differ; the check says so and is not made.
Prints one line per check and exits 1 on the first failure.
"""
import html
import json
import pathlib
import sys
from collections import defaultdict


def fail(message):
    print(f"compare: {message}")
    sys.exit(1)


def read_records(run):
    """{attempt: {rank: [(batch, draw, ids), ...]}} from a run's records/rank<R>.txt."""
    attempts = defaultdict(lambda: defaultdict(list))
    files = sorted((run / "records").glob("rank*.txt"))
    if not files:
        fail(f"{run} has no records/rank*.txt")
    for path in files:
        rank = int(path.stem[len("rank"):])
        for line in path.read_text().splitlines():
            attempt, batch, draw, *ids = line.split()
            attempts[int(attempt)][rank].append((int(batch), float(draw), [int(i) for i in ids]))
    return attempts


def uneven_batches(per_rank):
    """Batches whose records the ranks of one attempt shared unevenly (per-slot batches of two sizes)."""
    sizes = defaultdict(set)
    for rank in per_rank:
        for batch, _, ids in per_rank[rank]:
            sizes[batch].add(len(ids))
    return sorted(batch for batch, s in sizes.items() if len(s) > 1)


def read_metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def last_validation_loss(records, run):
    losses = [r for r in records if r["type"] == "validation"]
    if not losses:
        fail(f"{run} logged no validation")
    return losses[-1]["batches"], losses[-1]["metrics"]["validation_loss"]


def check_loss(reference_run, run, records, reference, attempts, resumed_at):
    for name, per_rank in [("the reference", reference[0])] + [("RUN", a) for a in attempts.values()]:
        uneven = [b for b in uneven_batches(per_rank) if b >= resumed_at]
        if uneven:
            print(f"loss: not compared ({name} shared global batch {uneven[0]} unevenly among its ranks)")
            return
    at, want = last_validation_loss(read_metrics(reference_run), reference_run)
    got_at, got = last_validation_loss(records, run)
    if at != got_at or abs(got - want) > 1e-5 * abs(want):
        fail(f"the last validation loss is {got} at batch {got_at}, the reference's {want} at batch {at}")
    print(f"loss: {got} at batch {at}, the reference's {want}")


def global_batches(per_rank):
    """{batch: records of every rank in rank order} and {batch: [draws]} for one attempt."""
    batches, draws = {}, defaultdict(list)
    for rank in sorted(per_rank):
        seen = set()
        for batch, draw, ids in per_rank[rank]:
            if batch in seen:
                fail(f"rank {rank} trained batch {batch} twice in one attempt")
            seen.add(batch)
            batches.setdefault(batch, []).extend(ids)
            draws[batch].append(draw)
    return batches, draws


def main():
    reference_run, run = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    expected = [tuple(int(n) for n in pair.split(">")) for pair in sys.argv[3:]]
    reference = read_records(reference_run)
    if list(reference) != [0]:
        fail(f"the reference {reference_run} was restarted")
    want, _ = global_batches(reference[0])

    records = read_metrics(run)
    seen = set()
    for r in records:
        if r["type"] in ("training", "validation", "checkpoint"):
            key = (r["type"], r["batches"])
            if key in seen:
                fail(f"metrics.jsonl holds two {r['type']} records at batch {r['batches']}: one of an attempt that was redone")
            seen.add(key)
    restarts = [r for r in records if r["type"] == "restart"]
    got_pairs = [(r["ranks_before"], r["ranks"]) for r in restarts]
    if got_pairs != expected:
        fail(f"metrics.jsonl's restart records say {got_pairs}, expected {expected}")
    print(f"restart records: {got_pairs} at batches {[r['batches'] for r in restarts]}")
    page = html.unescape((run / "report.html").read_text())
    for r in restarts:
        said = (f"at batch {r['batches']}, " + (f"restart {r['restart']}" if r.get("restart") else "resumed") +
                f" on {r['ranks']} rank(s)" + (f" (the checkpoint's job had {r['ranks_before']})" if r["ranks_before"] != r["ranks"] else ""))
        if said not in page:
            fail(f"report.html does not say '{said}'")

    attempts = read_records(run)
    trained = {}
    starts = [r["batches"] for r in restarts]
    for index, attempt in enumerate(sorted(attempts)):
        batches, draws = global_batches(attempts[attempt])
        first = min(batches)
        if index > 0 and restarts and first not in starts:
            fail(f"attempt {attempt} began at batch {first}, not at a checkpoint it resumed from ({starts})")
        for batch, ds in draws.items():
            if len(ds) > 1 and len(set(ds)) != len(ds):
                fail(f"attempt {attempt}: two ranks drew the same number at batch {batch} ({ds})")
        for batch, ids in batches.items():
            trained[batch] = ids  # a later attempt's batches replace what an earlier one trained
    if sorted(trained) != sorted(want):
        missing = sorted(set(want) - set(trained))
        extra = sorted(set(trained) - set(want))
        fail(f"batches trained differ from the reference's: missing {missing[:10]}, extra {extra[:10]}")
    for batch in sorted(want):
        if trained[batch] != want[batch]:
            fail(f"global batch {batch} holds records {trained[batch]}, the reference's {want[batch]}")
    check_loss(reference_run, run, records, reference, attempts, min(starts) if starts else 0)
    print(f"ok: {len(want)} global batches hold the reference's records in its order "
          f"({len(attempts)} attempt(s), {max(len(a) for a in attempts.values())} rank(s) at most)")


if __name__ == "__main__":
    main()
