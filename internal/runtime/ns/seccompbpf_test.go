package ns

import (
	"encoding/binary"
	"testing"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestCompactSeccomp: the range-test program decides as the library's for
// every system call number, of this architecture and of others, and every
// argument the policy's conditions look at, and is a fraction of its size.
func TestCompactSeccomp(t *testing.T) {
	filter, err := seccompFilter()
	if err != nil {
		t.Fatal(err)
	}
	info, err := arch.GetInfo("")
	if err != nil {
		t.Fatal(err)
	}
	libInsts, err := filter.Policy.Assemble()
	if err != nil {
		t.Fatal(err)
	}
	ours, err := compactProgram(filter.Policy, info)
	if err != nil {
		t.Fatal(err)
	}
	if len(ours)*3 > len(libInsts) {
		t.Errorf("%d instructions against the library's %d: not compact", len(ours), len(libInsts))
	}
	lib, err := bpf.NewVM(libInsts)
	if err != nil {
		t.Fatal(err)
	}
	vm, err := bpf.NewVM(ours)
	if err != nil {
		t.Fatalf("the compact program does not verify: %v", err)
	}
	// x/net/bpf's machine loads words big-endian, the kernel in the
	// machine's order: each word is written the way the machine will load
	// it, so that both see the same values.
	data := func(archID, nr uint32, arg0 uint64) []byte {
		b := make([]byte, 64)
		binary.BigEndian.PutUint32(b[0:], nr)
		binary.BigEndian.PutUint32(b[4:], archID)
		binary.BigEndian.PutUint32(b[16:], uint32(arg0))
		binary.BigEndian.PutUint32(b[20:], uint32(arg0>>32))
		return b
	}
	args := []uint64{0, 1, 8, 0x20000, 0x20008, 0xffffffff, 0x1_0000_0000, 0xffffffff_ffffffff,
		unix.AF_VSOCK, unix.AF_VSOCK | 1<<32, unix.AF_INET, unix.AF_UNIX,
		unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_THREAD, unix.CLONE_NEWUSER, unix.CLONE_NEWNET | unix.CLONE_VM,
		unix.CLONE_NEWCGROUP, 1 << 40, namespaceFlags}
	var allowedN, cases int
	check := func(archID, nr uint32, arg uint64) {
		t.Helper()
		want, err := lib.Run(data(archID, nr, arg))
		if err != nil {
			t.Fatal(err)
		}
		got, err := vm.Run(data(archID, nr, arg))
		if err != nil {
			t.Fatal(err)
		}
		cases++
		if got != want {
			t.Errorf("arch %#x nr %d arg %#x: %#x, the library's %#x", archID, nr, arg, got, want)
		}
		if archID == uint32(info.ID) && arg == 0 && uint32(got) == unix.SECCOMP_RET_ALLOW {
			allowedN++
		}
	}
	for nr := uint32(0); nr < 1024; nr++ {
		for _, arg := range args {
			check(uint32(info.ID), nr, arg)
		}
		check(uint32(info.ID)^1, nr, 0)
		check(uint32(info.ID), nr|uint32(arch.X32.SeccompMask), 0)
	}
	check(uint32(info.ID), 0xffffffff, 0)
	if allowedN < 250 {
		t.Errorf("only %d calls allowed: the test does not look at the profile", allowedN)
	}
	t.Logf("%d instructions (the library's %d); %d cases alike, %d calls allowed", len(ours), len(libInsts), cases, allowedN)
}
