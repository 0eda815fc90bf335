package ns

import (
	"encoding/binary"
	"fmt"
	"sync"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// allowed is Docker's default seccomp allow-list (moby profiles/seccomp/default.json),
// the syscalls it permits unconditionally plus those it grants for the
// capabilities atoll keeps (chroot for CAP_SYS_CHROOT). Everything else, notably
// mount, unshare, setns, bpf, perf_event_open, kexec_*, *_module, keyctl,
// add_key, request_key, userfaultfd and io_uring, fails with EPERM.
var allowed = []string{
	"accept", "accept4", "access", "adjtimex", "alarm", "arch_prctl", "bind", "brk",
	"cachestat", "capget", "capset", "chdir", "chmod", "chown", "chroot",
	"clock_adjtime", "clock_getres", "clock_gettime", "clock_nanosleep", "close",
	"close_range", "connect", "copy_file_range", "creat", "dup", "dup2", "dup3",
	"epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait",
	"epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "execve",
	"execveat", "exit", "exit_group", "faccessat", "faccessat2", "fadvise64",
	"fallocate", "fanotify_mark", "fchdir", "fchmod", "fchmodat", "fchmodat2",
	"fchown", "fchownat", "fcntl", "fdatasync", "fgetxattr", "flistxattr", "flock",
	"fork", "fremovexattr", "fsetxattr", "fstat", "fstatfs", "fsync", "ftruncate",
	"futex", "futex_requeue", "futex_wait", "futex_waitv", "futex_wake", "futimesat",
	"getcpu", "getcwd", "getdents", "getdents64", "getegid", "geteuid", "getgid",
	"getgroups", "getitimer", "getpeername", "getpgid", "getpgrp", "getpid",
	"getppid", "getpriority", "getrandom", "getresgid", "getresuid", "getrlimit",
	"get_robust_list", "getrusage", "getsid", "getsockname", "getsockopt",
	"get_thread_area", "gettid", "gettimeofday", "getuid", "getxattr",
	"inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch",
	"io_cancel", "ioctl", "io_destroy", "io_getevents", "io_pgetevents",
	"ioprio_get", "ioprio_set", "io_setup", "io_submit", "kill",
	"landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self",
	"lchown", "lgetxattr", "link", "linkat", "listen", "listxattr", "llistxattr",
	"lremovexattr", "lseek", "lsetxattr", "lstat", "madvise", "map_shadow_stack",
	"membarrier", "memfd_create", "memfd_secret", "mincore", "mkdir", "mkdirat",
	"mknod", "mknodat", "mlock", "mlock2", "mlockall", "mmap", "modify_ldt",
	"mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
	"mq_timedsend", "mq_unlink", "mremap", "msgctl", "msgget", "msgrcv", "msgsnd",
	"msync", "munlock", "munlockall", "munmap", "name_to_handle_at", "nanosleep",
	"newfstatat", "open", "openat", "openat2", "pause", "pidfd_open",
	"pidfd_send_signal", "pipe", "pipe2", "pkey_alloc", "pkey_free",
	"pkey_mprotect", "poll", "ppoll", "prctl", "pread64", "preadv", "preadv2",
	"prlimit64", "process_mrelease", "pselect6", "ptrace", "pwrite64", "pwritev",
	"pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "recvfrom",
	"recvmmsg", "recvmsg", "remap_file_pages", "removexattr", "rename", "renameat",
	"renameat2", "restart_syscall", "rmdir", "rseq", "rt_sigaction",
	"rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn",
	"rt_sigsuspend", "rt_sigtimedwait", "rt_tgsigqueueinfo", "sched_getaffinity",
	"sched_getattr", "sched_getparam", "sched_get_priority_max",
	"sched_get_priority_min", "sched_getscheduler", "sched_rr_get_interval",
	"sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler",
	"sched_yield", "seccomp", "select", "semctl", "semget", "semop", "semtimedop",
	"sendfile", "sendmmsg", "sendmsg", "sendto", "setfsgid", "setfsuid", "setgid",
	"setgroups", "setitimer", "setpgid", "setpriority", "setregid", "setresgid",
	"setresuid", "setreuid", "setrlimit", "set_robust_list", "setsid",
	"setsockopt", "set_thread_area", "set_tid_address", "setuid", "setxattr",
	"shmat", "shmctl", "shmdt", "shmget", "shutdown", "sigaltstack", "signalfd",
	"signalfd4", "socketpair", "splice", "stat", "statfs", "statx",
	"symlink", "symlinkat", "sync", "sync_file_range", "syncfs", "sysinfo", "tee",
	"tgkill", "time", "timer_create", "timer_delete", "timer_getoverrun",
	"timer_gettime", "timer_settime", "timerfd_create", "timerfd_gettime",
	"timerfd_settime", "times", "tkill", "truncate", "umask", "uname", "unlink",
	"unlinkat", "utime", "utimensat", "utimes", "vfork", "vmsplice", "wait4",
	"waitid", "write", "writev",
}

// namespaceFlags are the clone flags that create namespaces; Docker refuses them
// to processes without CAP_SYS_ADMIN, and so does atoll, to keep the kernel's
// user-namespace surface out of reach.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP

// seccompProgram is the default profile for the running architecture as
// the BPF program nsinit loads (nsinit.Config.Seccomp): instructions of 8
// bytes in the machine's byte order, struct sock_filter's layout. The node
// assembles it once; each sandbox's init stage used to assemble it again
// (the library's syscall tables of every architecture built at its start,
// then the program), a millisecond of CPU per sandbox.
var seccompProgram = sync.OnceValues(func() ([]byte, error) {
	filter, err := seccompFilter()
	if err != nil {
		return nil, err
	}
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp arch: %w", err)
	}
	insts, err := compactProgram(filter.Policy, info)
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp filter: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("assembling the seccomp filter: %w", err)
	}
	out := make([]byte, 0, 8*len(raw))
	for _, in := range raw {
		out = binary.NativeEndian.AppendUint16(out, in.Op)
		out = append(out, in.Jt, in.Jf)
		out = binary.NativeEndian.AppendUint32(out, in.K)
	}
	return out, nil
})

// seccompFilter builds the default profile for the running architecture.
func seccompFilter() (seccomp.Filter, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return seccomp.Filter{}, fmt.Errorf("seccomp arch: %w", err)
	}
	var names []string
	for _, n := range allowed {
		if _, ok := info.SyscallNames[n]; ok {
			names = append(names, n)
		}
	}
	personas := []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff}
	var persona []seccomp.NameWithConditions
	for _, p := range personas {
		persona = append(persona, seccomp.NameWithConditions{
			Name:       "personality",
			Conditions: []seccomp.Condition{{Argument: 0, Operation: seccomp.Equal, Value: p}},
		})
	}
	return seccomp.Filter{
		NoNewPrivs: true,
		Policy: seccomp.Policy{
			DefaultAction: seccomp.ActionErrno, // EPERM
			Syscalls: []seccomp.SyscallGroup{
				{Action: seccomp.ActionAllow, Names: names},
				{Action: seccomp.ActionAllow, NamesWithCondtions: append(persona,
					seccomp.NameWithConditions{Name: "clone", Conditions: []seccomp.Condition{
						{Argument: 0, Operation: seccomp.BitsNotSet, Value: namespaceFlags}}},
					// AF_VSOCK would reach the host's hypervisor sockets.
					seccomp.NameWithConditions{Name: "socket", Conditions: []seccomp.Condition{
						{Argument: 0, Operation: seccomp.NotEqual, Value: unix.AF_VSOCK}}},
				)},
				// clone3 passes its flags in memory that a filter cannot read;
				// ENOSYS makes libc fall back to clone, which is filtered.
				{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: []string{"clone3"}},
			},
		},
	}, nil
}
