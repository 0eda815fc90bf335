#!/bin/sh
# Regenerates the Go code of the envd protocol from the .proto files beside
# this script. The output is committed, so builds need none of these tools:
#   apt-get install protobuf-compiler
#   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
#   go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
set -eu
cd "$(dirname "$0")"
PATH="$(go env GOPATH)/bin:$PATH"
protoc -I . \
	--go_out=. --go_opt=paths=source_relative \
	--connect-go_out=. --connect-go_opt=paths=source_relative \
	process/process.proto filesystem/filesystem.proto
