// Package process is the Go code protoc generates from process.proto: the messages
// of E2B's envd process service. Edit the .proto and run ../generate.sh.
package process
