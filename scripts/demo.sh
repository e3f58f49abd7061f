#!/usr/bin/env bash
# Set up, serve the offline tiny model behind the gateway, and run an ordinary OpenAI-client agent
# against it; prints the recorded episode's summary (token-exact check included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 HARNESSRL_ADMIN_KEY="${HARNESSRL_ADMIN_KEY:-demo-admin-key}"
port="${PORT:-8000}"
harnessrl serve --model tiny --host 127.0.0.1 --port "$port" &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  python -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null && break
  kill -0 $server 2>/dev/null || { echo "the gateway failed to start" >&2; exit 1; }
  sleep 0.5
done
python examples/weather_agent.py --base-url "http://127.0.0.1:$port"
