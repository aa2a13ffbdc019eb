#!/usr/bin/env bash
# Regenerates onnx_subset.pb.go from onnx_subset.proto.
#
# Needs protoc (Debian: apt-get install protobuf-compiler) and protoc-gen-go
# at the version go.mod requires:
#     go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
set -euo pipefail
cd "$(dirname "$0")"
protoc --proto_path=. --go_out=. --go_opt=paths=source_relative onnx_subset.proto
