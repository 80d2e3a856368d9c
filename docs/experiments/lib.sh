# Helpers for the device call scripts, sourced after `cd` to the folder the
# script runs from: `. "$(dirname "$0")/lib.sh" NAME CAP` (copy this file
# into .gpu beside the script). Earlier sessions' scripts define their own
# copies; they are left as they ran.
#
#   R           $OUT/NAME, the call's results (tarred to $OUT/NAME.tgz at
#               each step, so a call cut short still returns what it did)
#   step L RC   logs step L's exit status and the seconds since the start
#   cap S       S, or what is left of the call's CAP seconds if less (>= 1)
#   secs L CMD  runs CMD, appending its wall time in ms to $R/times.txt
#   gpu_name    the first GPU's name
call_name=$1 call_cap=$2
OUT=${OUT:-/tmp/out}; R=$OUT/$call_name; mkdir -p "$R"
t0=$(date +%s)
step() { echo "$1 rc=$2 t=$(( $(date +%s) - t0 ))" | tee -a "$R/progress.txt"; tar czf "$OUT/$call_name.tgz" -C "$OUT" "$call_name"; }
cap() { local left=$(( call_cap - $(date +%s) + t0 )); echo $(( left < $1 ? (left > 1 ? left : 1) : $1 )); }
secs() { local label=$1; shift; local start=$(date +%s%N); "$@"; local rc=$?
  echo "$label $(( ($(date +%s%N) - start) / 1000000 )) ms rc=$rc" >> "$R/times.txt"; return $rc; }
gpu_name() { nvidia-smi --query-gpu=name --format=csv,noheader | head -1; }
