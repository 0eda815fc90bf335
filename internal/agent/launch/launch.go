// Package launch is the contract by which the atoll-agent binary is started:
// its name, the roles its first argument selects, and the descriptors and
// environment each role inherits. The runtimes that start it (ns, gvisor,
// vm) and the roles that run in it (package agent, nsinit, vminit, the vm's
// channel proxy) both read it from here, so that the two sides cannot drift
// apart; package agentbin dispatches on the roles. It imports nothing.
package launch

// Name is the binary's name, installed as Name-<hash> on the node (see
// agentbin.Install), and its argv[0] in a sandbox: what /proc/1/cmdline
// shows there.
const Name = "atoll-agent"

// Roles are the binary's first argument. Without one of these it is the
// agent alone: gvisor starts it so, and ns's Init goes on as it.
const (
	// Init (ns) sets the sandbox up from the inside (package nsinit):
	// ListenerFD and ControlFD inherited, an empty environment; then it
	// goes on as the agent.
	Init = "init"
	// VMInit is the vm's guest PID 1, started by the kernel from the
	// initramfs (package vminit).
	VMInit = "vm-init"
	// VMAgent is the vm guest's agent, started by VMInit with PortFD,
	// ControlFD and VMConfigVar.
	VMAgent = "vm-agent"
	// VMProxy runs on the host: the vm runtime's channel proxy
	// (atoll-agent vm-proxy CHARDEV-SOCKET LISTEN-SOCKET TIMEOUT).
	VMProxy = "vm-proxy"
	// Spawn runs on the host: the ns runtime's helper that starts sandbox
	// processes for the server (package spawn), SpawnFD inherited.
	Spawn = "spawn"
)

// Descriptors the roles inherit.
const (
	// ListenerFD is the agent's listening socket (ns), kept across exec.
	ListenerFD = 3
	// PortFD is the vm-agent's virtio-serial port.
	PortFD = 3
	// ControlFD is a stream socket to whoever set the sandbox up: the node
	// for Init (Config in, Status out), the guest's init for VMAgent.
	ControlFD = 4
	// SpawnFD is Spawn's SOCK_SEQPACKET socket to the server.
	SpawnFD = 3
)

// Environment variables the agent reads at start and then clears.
const (
	// EnvVar holds the sandbox's default environment, as a JSON object.
	EnvVar = "ATOLL_AGENT_ENV"
	// UserVar and CwdVar hold the default user and working directory.
	UserVar = "ATOLL_AGENT_USER"
	CwdVar  = "ATOLL_AGENT_CWD"
	// ListenVar, when set, is a unix socket path the agent listens on
	// instead of the listener inherited as ListenerFD: runtimes that cannot
	// hand a listening socket into the sandbox (gvisor's sentry cannot
	// accept on a host socket it did not bind) let the agent bind one in a
	// directory the host also sees.
	ListenVar = "ATOLL_AGENT_LISTEN"
	// VMConfigVar holds the vm guest's Config for VMAgent, as JSON.
	VMConfigVar = "ATOLL_VM_CONFIG"
)
