#!/usr/bin/env bash
# Entrypoint of the lab image: one image, one role per container.
#
#   master                 Spark standalone master (RPC $SPARK_MASTER_PORT, UI $SPARK_MASTER_WEBUI_PORT)
#   worker [MASTER_URL]    Spark standalone worker; cores/memory from SPARK_WORKER_CORES/_MEMORY
#   jupyter                JupyterLab, a Spark driver the executors can reach (spark.driver.host)
#   submit JOB [ARGS...]   run jobs/JOB.py (python) against $SPARK_MASTER_URL, e.g. `submit mnist --epochs 1`
#   mlflow [ARGS...]       the MLflow tracking server (UI + REST API) on $MLFLOW_SERVER_PORT (5000): SQLite store
#                          and artifacts under $MLFLOW_DATA_DIR (/mlflow); answers only Host headers that are
#                          loopback, localhost, `mlflow` (the lab's service name) or in MLFLOW_LOCAL_HOSTNAMES
#   wait-workers N [S]     poll the master's JSON until N workers are ALIVE (at most S tries, 1 s apart)
#   wait-url URL [S]       poll URL until it answers 2xx (at most S tries, 1 s apart)
#   anything else          exec'd as is (bash, python, spark-submit ...)
#
# Every role runs under tini (-s: subreaper, -g: signals go to the process group)
# so signals reach Spark/Jupyter and zombies are reaped even without `docker run --init`.
# Before starting, $SPARK_CONF_DIR/spark-defaults.conf is written from the
# environment (SPARK_DRIVER_* variables, SPARK_AUTH_SECRET and SPARK_CONF), so
# compose and Kubernetes configure Spark through env vars only. The Spark roles
# (master, worker, jupyter, submit) refuse to start without SPARK_AUTH_SECRET
# unless SPARK_AUTHENTICATE=false says so (docs/security.md). The `mlflow` role
# needs no secret and gets none.
set -eo pipefail

SPARK_MASTER_PORT="${SPARK_MASTER_PORT:-7077}"
SPARK_MASTER_WEBUI_PORT="${SPARK_MASTER_WEBUI_PORT:-8080}"
SPARK_MASTER_URL="${SPARK_MASTER_URL:-spark://master:${SPARK_MASTER_PORT}}"
SPARK_WORKER_WEBUI_PORT="${SPARK_WORKER_WEBUI_PORT:-8081}"
JUPYTER_PORT="${JUPYTER_PORT:-8888}"
TRAINER_JOBS_DIR="${TRAINER_JOBS_DIR:-/opt/trainer/jobs}"
MLFLOW_SERVER_PORT="${MLFLOW_SERVER_PORT:-5000}"
MLFLOW_DATA_DIR="${MLFLOW_DATA_DIR:-/mlflow}"
# The full mlflow of the server's own venv (images/Dockerfile); the other roles use /opt/venv's.
MLFLOW_SERVER_BIN="${MLFLOW_SERVER_BIN:-/opt/mlflow/bin/mlflow}"

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

# Spark RPC authentication and encryption (AES-GCM) with the lab's shared secret:
# the master, the workers (which hand it to their executors in Spark's own
# _SPARK_AUTH_SECRET variable) and every driver need the same settings.
spark_security_conf() {
    if [ -z "${SPARK_AUTH_SECRET:-}" ]; then
        if [ "${SPARK_AUTHENTICATE:-true}" = "false" ]; then
            log "SPARK_AUTHENTICATE=false: Spark RPC is neither authenticated nor encrypted; whoever reaches the master runs code on the workers"
            return 0
        fi
        log "SPARK_AUTH_SECRET is empty: expected the lab's Spark secret (\`make up\` generates one in compose/lab-secrets.env," \
            "on Kubernetes the Job lab-secrets-init makes the Secret lab-secrets, or \`make k8s-secrets\` writes k8s/components/own-secrets/lab-secrets.env); set SPARK_AUTHENTICATE=false to run without Spark authentication on purpose"
        exit 2
    fi
    if [[ ! "$SPARK_AUTH_SECRET" =~ ^[A-Za-z0-9._~+/=-]{16,}$ ]]; then
        log "SPARK_AUTH_SECRET must be at least 16 characters of A-Z a-z 0-9 . _ ~ + / = -, got ${#SPARK_AUTH_SECRET} characters" \
            "of another form; generate one with: od -An -N32 -tx1 /dev/urandom | tr -d ' \\n'"
        exit 2
    fi
    echo "spark.authenticate true"
    echo "spark.authenticate.secret $SPARK_AUTH_SECRET"
    echo "spark.network.crypto.enabled true"
    echo "spark.network.crypto.authEngineVersion 2"
    echo "spark.network.crypto.cipher AES/GCM/NoPadding"
    echo "spark.network.crypto.saslFallback false"
}

# The submit role's driver prints only the job's output: Spark's "Using Spark's default log4j profile" line and
# the NativeCodeLoader WARN come from the log4j defaults Spark uses when $SPARK_CONF_DIR has no log4j2.properties.
# VERBOSE=1 (`make submit VERBOSE=1`) or TRAINER_LOG=info|debug keep Spark's defaults; a file of the user's wins.
write_quiet_log4j() {
    local file="${SPARK_CONF_DIR:?SPARK_CONF_DIR must be set}/log4j2.properties"
    if [ -n "${VERBOSE:-}" ] || [ -n "${TRAINER_LOG:-}" ] || [ -f "$file" ]; then return 0; fi
    cat >"$file" <<'LOG4J'
# Written by entrypoint.sh (submit): errors only; VERBOSE=1 shows Spark's own start-up lines.
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = off
LOG4J
}

write_spark_defaults() {
    local conf_dir="${SPARK_CONF_DIR:?SPARK_CONF_DIR must be set}"
    local file="$conf_dir/spark-defaults.conf"
    mkdir -p "$conf_dir"
    # Mode 0600: the file holds the secret, which stays out of argv and, once
    # written, out of the daemon's environment.
    rm -f "$file"
    (umask 077 && : >"$file")
    {
        echo "# Written by entrypoint.sh from the environment at $(date -u +%FT%TZ); edits are lost on restart."
        spark_security_conf
        [ -n "$SPARK_DRIVER_HOST" ] && echo "spark.driver.host $SPARK_DRIVER_HOST"
        [ -n "$SPARK_DRIVER_BIND_ADDRESS" ] && echo "spark.driver.bindAddress $SPARK_DRIVER_BIND_ADDRESS"
        [ -n "$SPARK_DRIVER_PORT" ] && echo "spark.driver.port $SPARK_DRIVER_PORT"
        [ -n "$SPARK_BLOCKMANAGER_PORT" ] && echo "spark.driver.blockManager.port $SPARK_BLOCKMANAGER_PORT"
        # A worker sent SIGPWR (make worker-decommission) leaves gracefully: its executors finish their running
        # tasks, take no new ones and hand their cached blocks to the others.
        echo "spark.decommission.enabled true"
        echo "spark.storage.decommission.enabled true"
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
    unset SPARK_AUTH_SECRET
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
        if [ -z "${JUPYTER_TOKEN:-}" ]; then
            log "JUPYTER_TOKEN is empty: expected the token Jupyter asks for (\`make up\` generates one in compose/lab-secrets.env)"
            exit 2
        fi
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
        # allow_remote_access off: Jupyter answers only requests whose Host header is
        # a loopback address, localhost or a name in JUPYTER_LOCAL_HOSTNAMES
        # (space- or comma-separated), against DNS rebinding (docs/security.md).
        CMD=(jupyter lab --ip=0.0.0.0 --port="$JUPYTER_PORT" --no-browser
            --ServerApp.root_dir="$root"
            --ServerApp.allow_remote_access=False
            --ServerApp.local_hostnames=localhost)
        for name in ${JUPYTER_LOCAL_HOSTNAMES//,/ }; do CMD+=(--ServerApp.local_hostnames="$name"); done
        CMD+=("$@")
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
        write_quiet_log4j
        args=("$@")
        [[ " ${args[*]} " == *" --master "* || " ${args[*]} " == *" --master="* ]] || args=(--master "$SPARK_MASTER_URL" "${args[@]}")
        run python "$script" "${args[@]}"
        ;;
    mlflow)
        shift
        # Nothing of Spark's or Jupyter's is needed here (compose gives none; be sure).
        unset SPARK_AUTH_SECRET JUPYTER_TOKEN
        if [[ ! "$MLFLOW_SERVER_PORT" =~ ^[0-9]+$ ]]; then
            # Kubernetes' service links would set MLFLOW_PORT=tcp://IP:5000 (the pods set enableServiceLinks: false).
            log "MLFLOW_SERVER_PORT must be a port number, got '$MLFLOW_SERVER_PORT'"
            exit 2
        fi
        if [ ! -x "$MLFLOW_SERVER_BIN" ]; then
            log "no MLflow server at $MLFLOW_SERVER_BIN: the image installs the full mlflow there (images/Dockerfile)"
            exit 2
        fi
        mkdir -p "$MLFLOW_DATA_DIR/artifacts" || {
            log "cannot write $MLFLOW_DATA_DIR as UID $(id -u): mount a volume there that UID 185 may write"
            exit 2
        }
        # Host header check (DNS rebinding): loopback names on any port (the published port is the host's
        # choice), `mlflow` on the server's port (the lab's service name, what MLFLOW_TRACKING_URI names), and
        # the names a browser may use (MLFLOW_LOCAL_HOSTNAMES, space- or comma-separated), which are also
        # the origins allowed to POST from a browser (MLflow admits the loopback origins itself).
        hosts="localhost,localhost:*,127.0.0.1,127.0.0.1:*,[::1],[[]::1]:*,mlflow,mlflow:$MLFLOW_SERVER_PORT"
        origins=""
        for name in ${MLFLOW_LOCAL_HOSTNAMES//,/ }; do
            if [[ ! "$name" =~ ^[A-Za-z0-9.-]+$ ]]; then
                log "ignoring MLFLOW_LOCAL_HOSTNAMES entry '$name': expected a host name (letters, digits, '.', '-')"
                continue
            fi
            hosts+=",$name,$name:*"
            origins+="${origins:+,}http://$name,http://$name:*,https://$name,https://$name:*"
        done
        # No GenAI job runner (huey) and no telemetry in an offline lab; one worker process on a small machine.
        export MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}"
        export MLFLOW_DISABLE_TELEMETRY="${MLFLOW_DISABLE_TELEMETRY:-true}"
        CMD=("$MLFLOW_SERVER_BIN" server
            --host 0.0.0.0 --port "$MLFLOW_SERVER_PORT" --workers "${MLFLOW_WORKERS:-1}"
            --backend-store-uri "sqlite:///$MLFLOW_DATA_DIR/mlflow.db"
            --serve-artifacts --artifacts-destination "$MLFLOW_DATA_DIR/artifacts"
            --allowed-hosts "$hosts")
        [ -n "$origins" ] && CMD+=(--cors-allowed-origins "$origins")
        CMD+=("$@")
        run "${CMD[@]}"
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
        log "usage: master | worker [spark://HOST:PORT] | jupyter | submit JOB [ARGS] | mlflow [ARGS] | wait-workers N [S] | wait-url URL [S] | COMMAND..."
        exit 2
        ;;
    *)
        run "$@"
        ;;
esac
