#!/usr/bin/env bash
# Entrypoint of the lab image: one image, one role per container.
#
#   master                 Spark standalone master (RPC $SPARK_MASTER_PORT, UI $SPARK_MASTER_WEBUI_PORT)
#   worker [MASTER_URL]    Spark standalone worker; cores/memory from SPARK_WORKER_CORES/_MEMORY
#   jupyter                JupyterLab, a Spark driver the executors can reach (spark.driver.host)
#   submit JOB [ARGS...]   run jobs/JOB.py (python) against $SPARK_MASTER_URL, e.g. `submit mnist --epochs 1`
#   wait-workers N [S]     poll the master's JSON until N workers are ALIVE (at most S tries, 1 s apart)
#   wait-url URL [S]       poll URL until it answers 2xx (at most S tries, 1 s apart)
#   anything else          exec'd as is (bash, python, spark-submit ...)
#
# Every role runs under tini (-s: subreaper, -g: signals go to the process group)
# so signals reach Spark/Jupyter and zombies are reaped even without `docker run --init`.
# Before starting, $SPARK_CONF_DIR/spark-defaults.conf is written from the
# environment (SPARK_DRIVER_* variables and SPARK_CONF), so compose and
# Kubernetes configure Spark through env vars only.
set -eo pipefail

SPARK_MASTER_PORT="${SPARK_MASTER_PORT:-7077}"
SPARK_MASTER_WEBUI_PORT="${SPARK_MASTER_WEBUI_PORT:-8080}"
SPARK_MASTER_URL="${SPARK_MASTER_URL:-spark://master:${SPARK_MASTER_PORT}}"
SPARK_WORKER_WEBUI_PORT="${SPARK_WORKER_WEBUI_PORT:-8081}"
JUPYTER_PORT="${JUPYTER_PORT:-8888}"
TRAINER_JOBS_DIR="${TRAINER_JOBS_DIR:-/opt/trainer/jobs}"

log() { echo "entrypoint: $*" >&2; }

# First IPv4 address of this container: always resolvable by its peers.
own_ip() { hostname -i | tr ' ' '\n' | grep -m1 -E '^[0-9]+(\.[0-9]+){3}$' || hostname -i | awk '{print $1}'; }

# A name for this container that other containers resolve. Kubernetes
# StatefulSet pods get an FQDN via their headless service (`hostname -f`);
# compose containers resolve by IP, which needs no DNS at all.
advertised_host() {
    local fqdn
    fqdn="$(hostname -f 2>/dev/null || true)"
    if [[ "$fqdn" == *.svc.* || "$fqdn" == *.svc ]]; then echo "$fqdn"; else own_ip; fi
}

write_spark_defaults() {
    local conf_dir="${SPARK_CONF_DIR:?SPARK_CONF_DIR must be set}"
    local file="$conf_dir/spark-defaults.conf"
    mkdir -p "$conf_dir"
    {
        echo "# Written by entrypoint.sh from the environment at $(date -u +%FT%TZ); edits are lost on restart."
        [ -n "$SPARK_DRIVER_HOST" ] && echo "spark.driver.host $SPARK_DRIVER_HOST"
        [ -n "$SPARK_DRIVER_BIND_ADDRESS" ] && echo "spark.driver.bindAddress $SPARK_DRIVER_BIND_ADDRESS"
        [ -n "$SPARK_DRIVER_PORT" ] && echo "spark.driver.port $SPARK_DRIVER_PORT"
        [ -n "$SPARK_BLOCKMANAGER_PORT" ] && echo "spark.driver.blockManager.port $SPARK_BLOCKMANAGER_PORT"
        # SPARK_CONF: extra `key=value` pairs separated by spaces or newlines
        # (values cannot contain spaces), e.g. the GPU settings of compose/gpu.yaml.
        local pair
        for pair in $SPARK_CONF; do
            if [[ "$pair" != spark.*=* ]]; then
                log "ignoring SPARK_CONF entry '$pair': expected spark.key=value"
                continue
            fi
            echo "${pair%%=*} ${pair#*=}"
        done
    } >"$file"
}

run() {
    log "starting: $*"
    exec tini -s -g -- "$@"
}

role="${1:-}"
case "$role" in
    master)
        shift
        write_spark_defaults
        CMD=(spark-class org.apache.spark.deploy.master.Master
            --host "${SPARK_MASTER_HOST:-$(hostname)}"
            --port "$SPARK_MASTER_PORT"
            --webui-port "$SPARK_MASTER_WEBUI_PORT"
            "$@")
        run "${CMD[@]}"
        ;;
    worker)
        shift
        master_url="$SPARK_MASTER_URL"
        if [[ "${1:-}" == spark://* ]]; then master_url="$1"; shift; fi
        write_spark_defaults
        CMD=(spark-class org.apache.spark.deploy.worker.Worker
            --host "${SPARK_WORKER_HOST:-$(advertised_host)}"
            --cores "${SPARK_WORKER_CORES:-1}"
            --memory "${SPARK_WORKER_MEMORY:-1g}"
            --webui-port "$SPARK_WORKER_WEBUI_PORT"
            "$@" "$master_url")
        run "${CMD[@]}"
        ;;
    jupyter)
        shift
        # The driver must be reachable from the executors: compose/k8s set
        # SPARK_DRIVER_HOST to a service name; fall back to our own address.
        export SPARK_DRIVER_HOST="${SPARK_DRIVER_HOST:-$(advertised_host)}"
        export SPARK_DRIVER_BIND_ADDRESS="${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}"
        export TRAINER_PS_HOST="${TRAINER_PS_HOST:-$SPARK_DRIVER_HOST}"
        export TRAINER_PS_BIND="${TRAINER_PS_BIND:-0.0.0.0}"
        write_spark_defaults
        root="${JUPYTER_ROOT:-$HOME/work}"
        mkdir -p "$root"
        # Seed the example notebooks once; never overwrite the user's edits.
        cp -rn "$TRAINER_JOBS_DIR/notebooks" "$root/" 2>/dev/null || true
        CMD=(jupyter lab --ip=0.0.0.0 --port="$JUPYTER_PORT" --no-browser
            --ServerApp.root_dir="$root"
            --ServerApp.allow_remote_access=True
            "$@")
        # The token comes from $JUPYTER_TOKEN (read by jupyter itself), never argv.
        run "${CMD[@]}"
        ;;
    submit)
        shift
        job="${1:?usage: submit JOB [ARGS...]  (JOB is a file in $TRAINER_JOBS_DIR, e.g. mnist)}"
        shift
        script="$TRAINER_JOBS_DIR/${job%.py}.py"
        if [ ! -f "$script" ]; then
            log "no job '$job': expected $script; available: $(cd "$TRAINER_JOBS_DIR" && ls ./*.py 2>/dev/null | xargs -n1 basename | sed 's/\.py$//' | tr '\n' ' ')"
            exit 2
        fi
        # This container is the driver: advertise an address the workers reach.
        export SPARK_DRIVER_HOST="${SPARK_DRIVER_HOST:-$(own_ip)}"
        export SPARK_DRIVER_BIND_ADDRESS="${SPARK_DRIVER_BIND_ADDRESS:-0.0.0.0}"
        export TRAINER_PS_HOST="${TRAINER_PS_HOST:-$SPARK_DRIVER_HOST}"
        export TRAINER_PS_BIND="${TRAINER_PS_BIND:-0.0.0.0}"
        write_spark_defaults
        args=("$@")
        [[ " ${args[*]} " == *" --master "* || " ${args[*]} " == *" --master="* ]] || args=(--master "$SPARK_MASTER_URL" "${args[@]}")
        run python "$script" "${args[@]}"
        ;;
    wait-workers)
        shift
        want="${1:?usage: wait-workers N [MAX_SECONDS]}"
        max_tries="${2:-180}"
        url="${SPARK_MASTER_JSON_URL:-http://localhost:${SPARK_MASTER_WEBUI_PORT}/json/}"
        alive=""
        for ((i = 1; i <= max_tries; i++)); do
            alive="$(curl -fsS --max-time 3 "$url" 2>/dev/null |
                python -c 'import json,sys; print(sum(w["state"] == "ALIVE" for w in json.load(sys.stdin)["workers"]))' 2>/dev/null || true)"
            if [ "$alive" = "$want" ]; then
                log "$alive worker(s) ALIVE at $url after ${i} tries"
                exit 0
            fi
            sleep 1
        done
        log "timed out after ${max_tries} tries: expected $want ALIVE worker(s) at $url, found ${alive:-none (master not answering)}."
        log "look at the worker logs: make logs (or docker-compose logs worker)"
        exit 1
        ;;
    wait-url)
        shift
        url="${1:?usage: wait-url URL [MAX_TRIES]}"
        max_tries="${2:-180}"
        for ((i = 1; i <= max_tries; i++)); do
            if curl -fsS --max-time 3 -o /dev/null "$url" 2>/dev/null; then
                log "$url answered after ${i} tries"
                exit 0
            fi
            sleep 1
        done
        log "timed out after ${max_tries} tries: $url does not answer"
        exit 1
        ;;
    "")
        log "usage: master | worker [spark://HOST:PORT] | jupyter | submit JOB [ARGS] | wait-workers N [S] | wait-url URL [S] | COMMAND..."
        exit 2
        ;;
    *)
        run "$@"
        ;;
esac
