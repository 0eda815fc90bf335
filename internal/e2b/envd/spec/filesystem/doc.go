// Package filesystem is the Go code protoc generates from filesystem.proto: the messages
// of E2B's envd filesystem service. Edit the .proto and run ../generate.sh.
package filesystem
