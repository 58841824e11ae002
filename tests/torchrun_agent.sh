#!/usr/bin/env bash
# Usage: torchrun_agent.sh PYTHON TORCHRUN_ARGS...
# PYTHON's torchrun (torch.distributed.run) with TORCHRUN_ARGS, as the tests start it under any
# release: --redirects 1 --tee 1, because torch 1.13's agent under Python 3.11 cannot parse the
# default "0" (its Std flag enumeration skips the zero member; a rank's stdout then also goes to a
# log file of the agent's, and the console sees it as before). Callers spell flags with underscores
# (--max_restarts, --rdzv_backend), which every release accepts and 1.13 requires. The agent looks
# at its workers every half second (--monitor_interval 0.5): torch 1.13's default, 5 s, made each
# detected failure wait up to 5 s (later releases look every 0.1 s).
python=$1
shift
exec "$python" -m torch.distributed.run --redirects 1 --tee 1 --monitor_interval 0.5 "$@"
