// Package filesystemconnect is the Connect RPC client and handler code protoc
// generates for E2B's envd filesystem service. Edit ../filesystem.proto and run
// ../../generate.sh.
package filesystemconnect
