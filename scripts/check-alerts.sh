#!/usr/bin/env bash
# Checks the Prometheus alert rules (deploy/grafana/alerts.yml) with promtool: that Prometheus
# loads them, and that each fires on what deploy/grafana/alerts.test.yml says and on nothing
# else. promtool comes from Debian's prometheus package, unpacked under target/promtool: nothing
# is installed and no service is started.
set -euo pipefail
cd "$(dirname "$0")/.."
promtool=target/promtool/usr/bin/promtool
if [ ! -x "$promtool" ]; then
    echo "unpacking promtool from Debian's prometheus package into target/promtool" >&2
    download=$(mktemp -d)
    trap 'rm -rf "$download"' EXIT
    (cd "$download" && apt-get download -q prometheus >&2)
    dpkg-deb -x "$download"/prometheus_*.deb target/promtool
fi
"$promtool" check rules deploy/grafana/alerts.yml
(cd deploy/grafana && "../../$promtool" test rules alerts.test.yml)
