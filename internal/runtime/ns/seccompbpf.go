package ns

import (
	"encoding/binary"
	"fmt"
	"slices"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The filter is assembled here as ranges of system call numbers, from the
// same seccomp.Policy the library assembles. The library's program tests
// one number after another (340 instructions for this profile), and the
// kernel runs the whole program for every system call number when a filter
// is loaded, to find the calls it allows whatever their arguments (its
// action cache): with interrupts off, 4% of a sandbox's start. The
// allow-list is 31 runs of consecutive numbers; testing runs in ascending
// order takes a fifth of the instructions and of the steps. The two
// programs decide alike for every number and argument the policy looks at
// (TestCompactSeccomp runs both).

// seccomp_data's layout (linux/seccomp.h).
const (
	nrOffset   = 0
	archOff    = 4
	argsOffset = 16
)

// compactProgram assembles p for the architecture info as range tests.
// Each system call may be named in one group; conditions are Equal,
// NotEqual and BitsNotSet, alternatives of a call are ORed, the conditions
// of one alternative ANDed, as the library does; a call whose alternatives
// all fail gets p.DefaultAction.
func compactProgram(p seccomp.Policy, info *arch.Info) ([]bpf.Instruction, error) {
	type alt = []seccomp.Condition
	type rule struct {
		action seccomp.Action
		alts   []alt // none: unconditional
	}
	rules := map[uint32]*rule{}
	add := func(name string, action seccomp.Action, conds []seccomp.Condition) error {
		num, ok := info.SyscallNames[name]
		if !ok {
			return fmt.Errorf("seccomp: no system call %q on %s", name, info.Name)
		}
		nr := uint32(num | info.SeccompMask)
		r := rules[nr]
		switch {
		case r == nil:
			r = &rule{action: action}
			rules[nr] = r
		case r.action != action || len(r.alts) == 0 || conds == nil:
			return fmt.Errorf("seccomp: %s named twice", name)
		}
		if conds != nil {
			r.alts = append(r.alts, conds)
		}
		return nil
	}
	for _, g := range p.Syscalls {
		for _, n := range g.Names {
			if err := add(n, g.Action, nil); err != nil {
				return nil, err
			}
		}
		for _, nc := range g.NamesWithCondtions {
			if err := add(nc.Name, g.Action, nc.Conditions); err != nil {
				return nil, err
			}
		}
	}

	a := &asm{labels: map[string]int{}}
	retDefault, retFor := "ret:default", func(act seccomp.Action) string { return fmt.Sprintf("ret:%#x", uint32(act)) }
	a.emit(bpf.LoadAbsolute{Off: archOff, Size: 4})
	a.jumpIf(bpf.JumpEqual, uint32(info.ID), "", retDefault)
	a.emit(bpf.LoadAbsolute{Off: nrOffset, Size: 4})
	returns := map[string]uint32{retDefault: ret(p.DefaultAction)}
	if info.ID == arch.X86_64.ID {
		// x32's numbers carry this bit: refused, as the library does.
		enosys := seccomp.ActionErrno | seccomp.Action(unix.ENOSYS)
		returns[retFor(enosys)] = uint32(enosys)
		a.jumpIf(bpf.JumpGreaterOrEqual, uint32(arch.X32.SeccompMask), retFor(enosys), "")
	}

	// Runs of consecutive numbers with one unconditional action; a call with
	// conditions is a run of its own, tested in a block after the runs.
	nrs := make([]uint32, 0, len(rules))
	for nr := range rules {
		nrs = append(nrs, nr)
	}
	slices.Sort(nrs)
	var blocks []uint32
	for i := 0; i < len(nrs); {
		lo, r := nrs[i], rules[nrs[i]]
		hi := lo
		if len(r.alts) == 0 {
			for i+1 < len(nrs) && nrs[i+1] == hi+1 && len(rules[nrs[i+1]].alts) == 0 && rules[nrs[i+1]].action == r.action {
				i++
				hi = nrs[i]
			}
		}
		i++
		target := retFor(r.action)
		if len(r.alts) > 0 {
			target = fmt.Sprintf("block:%d", lo)
			blocks = append(blocks, lo)
		} else {
			returns[target] = ret(r.action)
		}
		// Below lo (and above the run before): not named.
		a.jumpIf(bpf.JumpGreaterOrEqual, lo, "", retDefault)
		a.jumpIf(bpf.JumpGreaterThan, hi, "", target)
	}
	a.jump(retDefault)

	for _, nr := range blocks {
		r := rules[nr]
		returns[retFor(r.action)] = ret(r.action)
		a.label(fmt.Sprintf("block:%d", nr))
		for i, conds := range r.alts {
			fail := fmt.Sprintf("block:%d:%d", nr, i+1)
			if i == len(r.alts)-1 {
				fail = retDefault
			}
			for j, c := range conds {
				next := fmt.Sprintf("block:%d:%d:%d", nr, i, j+1)
				if err := a.condition(c, next, fail); err != nil {
					return nil, err
				}
				a.label(next)
			}
			a.jump(retFor(r.action))
			if fail != retDefault {
				a.label(fail)
			}
		}
	}

	// The returns, last, so that every jump to them is forward.
	names := make([]string, 0, len(returns))
	for name := range returns {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		a.label(name)
		a.emit(bpf.RetConstant{Val: returns[name]})
	}
	return a.resolve()
}

// ret is the value an action returns: an errno action without one is
// EPERM's, as in the library.
func ret(act seccomp.Action) uint32 {
	if act == seccomp.ActionErrno {
		act |= 1 // EPERM
	}
	return uint32(act)
}

// asm is a BPF program under construction, with jumps to labels.
type asm struct {
	insts  []bpf.Instruction
	labels map[string]int // label → instruction index
	fixups []fixup        // jumps to resolve
}

type fixup struct {
	at              int
	taken, notTaken string // "": the next instruction
	cond            bpf.JumpTest
	val             uint32
	unconditional   bool
}

func (a *asm) emit(in bpf.Instruction) { a.insts = append(a.insts, in) }

func (a *asm) label(name string) { a.labels[name] = len(a.insts) }

// jumpIf emits a conditional jump: to taken if A cond val holds, else to
// notTaken ("" for the next instruction).
func (a *asm) jumpIf(cond bpf.JumpTest, val uint32, taken, notTaken string) {
	a.fixups = append(a.fixups, fixup{at: len(a.insts), taken: taken, notTaken: notTaken, cond: cond, val: val})
	a.emit(nil)
}

func (a *asm) jump(to string) {
	a.fixups = append(a.fixups, fixup{at: len(a.insts), taken: to, unconditional: true})
	a.emit(nil)
}

// condition emits the test of c on a 64-bit argument: on to next if it
// holds, to fail if not.
func (a *asm) condition(c seccomp.Condition, next, fail string) error {
	lo, hi := uint32(argsOffset+8*c.Argument), uint32(argsOffset+8*c.Argument+4)
	if binary.NativeEndian.Uint16([]byte{0, 1}) == 1 { // big-endian
		lo, hi = hi, lo
	}
	vlo, vhi := uint32(c.Value), uint32(c.Value>>32)
	switch c.Operation {
	case seccomp.Equal:
		a.emit(bpf.LoadAbsolute{Off: hi, Size: 4})
		a.jumpIf(bpf.JumpEqual, vhi, "", fail)
		a.emit(bpf.LoadAbsolute{Off: lo, Size: 4})
		a.jumpIf(bpf.JumpEqual, vlo, next, fail)
	case seccomp.NotEqual:
		a.emit(bpf.LoadAbsolute{Off: hi, Size: 4})
		a.jumpIf(bpf.JumpEqual, vhi, "", next)
		a.emit(bpf.LoadAbsolute{Off: lo, Size: 4})
		a.jumpIf(bpf.JumpEqual, vlo, fail, next)
	case seccomp.BitsNotSet:
		if vhi != 0 {
			a.emit(bpf.LoadAbsolute{Off: hi, Size: 4})
			a.jumpIf(bpf.JumpBitsSet, vhi, fail, "")
		}
		a.emit(bpf.LoadAbsolute{Off: lo, Size: 4})
		a.jumpIf(bpf.JumpBitsSet, vlo, fail, next)
	default:
		return fmt.Errorf("seccomp: condition %v not supported", c.Operation)
	}
	return nil
}

// resolve turns the jumps into offsets: forward only, conditional ones
// within 255 instructions, as classic BPF has them.
func (a *asm) resolve() ([]bpf.Instruction, error) {
	off := func(from int, to string) (uint32, error) {
		if to == "" {
			return 0, nil
		}
		at, ok := a.labels[to]
		if !ok {
			return 0, fmt.Errorf("seccomp: no label %s", to)
		}
		if at <= from {
			return 0, fmt.Errorf("seccomp: jump back to %s", to)
		}
		return uint32(at - from - 1), nil
	}
	for _, f := range a.fixups {
		if f.unconditional {
			n, err := off(f.at, f.taken)
			if err != nil {
				return nil, err
			}
			a.insts[f.at] = bpf.Jump{Skip: n}
			continue
		}
		t, err := off(f.at, f.taken)
		if err != nil {
			return nil, err
		}
		n, err := off(f.at, f.notTaken)
		if err != nil {
			return nil, err
		}
		if t > 255 || n > 255 {
			return nil, fmt.Errorf("seccomp: a conditional jump of more than 255 instructions")
		}
		a.insts[f.at] = bpf.JumpIf{Cond: f.cond, Val: f.val, SkipTrue: uint8(t), SkipFalse: uint8(n)}
	}
	return a.insts, nil
}
