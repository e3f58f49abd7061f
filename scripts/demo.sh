#!/usr/bin/env bash
# Set up, serve the offline tiny model behind the gateway, and run an ordinary OpenAI-client agent
# against it; prints the recorded episode's summary (token-exact check included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HARNESSRL_ADMIN_KEY="${HARNESSRL_ADMIN_KEY:-demo-admin-key}"
port="${PORT:-8000}"
# a server already on the port would answer the health check below, and the demo would talk to it with our key
python -c "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('127.0.0.1', $port))" 2>/dev/null || { echo "port $port is taken: PORT=8001 bash scripts/demo.sh" >&2; exit 1; }
harnessrl serve --model tiny --host 127.0.0.1 --port "$port" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
ready=0
for _ in $(seq 1 120); do
  python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && { ready=1; break; }
  kill -0 $server 2>/dev/null || { echo "the gateway failed to start" >&2; exit 1; }
  sleep 0.5
done
[ "$ready" = 1 ] || { echo "the gateway did not answer on port $port within 60 s" >&2; exit 1; }
python examples/weather_agent.py --base-url "http://127.0.0.1:$port"
