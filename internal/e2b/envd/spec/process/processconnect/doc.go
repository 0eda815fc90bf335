// Package processconnect is the Connect RPC client and handler code protoc
// generates for E2B's envd process service. Edit ../process.proto and run
// ../../generate.sh.
package processconnect
