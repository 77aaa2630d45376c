#!/usr/bin/env bash
# One command for the benchmarks, from the repository root:
#   bash bench/run.sh [bench flags]
# Starts a Redis for the asynq peer (installing Debian's redis-server if it
# is missing), runs the bench, and writes docs/benchmarks.md with its plots.
set -euo pipefail
cd "$(dirname "$0")"
export GOTOOLCHAIN=local
port=6390
if ! command -v redis-server >/dev/null 2>&1; then
  echo "installing redis-server (Debian package) for the asynq peer"
  (apt-get install -y redis-server >/dev/null 2>&1 || sudo apt-get install -y redis-server >/dev/null 2>&1) ||
    echo "redis-server unavailable: the asynq peer will be skipped"
fi
redis_dir=$(mktemp -d)
if command -v redis-server >/dev/null 2>&1; then
  # Durable like JetStream's default file store: an append-only file,
  # fsynced every second.
  redis-server --port "$port" --bind 127.0.0.1 --dir "$redis_dir" --appendonly yes --appendfsync everysec \
    --save '' --daemonize yes --pidfile "$redis_dir/redis.pid" --logfile "$redis_dir/redis.log"
  # Stopped and waited for, so that a run right after this one does not
  # find the port still held by a Redis on its way out.
  stop_redis() {
    local pid
    pid=$(cat "$redis_dir/redis.pid" 2>/dev/null) || pid=
    if [[ -n $pid ]] && kill "$pid" 2>/dev/null; then
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -rf "$redis_dir"
  }
  trap stop_redis EXIT
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
fi
go run . -redis "127.0.0.1:$port" -out ../docs "$@"
