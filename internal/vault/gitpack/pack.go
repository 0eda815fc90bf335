// Package gitpack reads and writes git's pack format (gitformat-pack(5)),
// for the vault's in-process receipt of small pushes: a pack as a client
// sends it (thin: its deltas may name bases only the receiver has) read
// and resolved, completed with those bases, and given its index (version
// 2); objects read back from a repository's packs and loose files.
//
// It is written for packs of bounded size held in memory: every limit a
// hostile pack could push past is an error, never a panic or an
// allocation of what the pack claims.
package gitpack

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strconv"
)

// Object types, as a pack's entries number them.
const (
	Commit   = 1
	Tree     = 2
	Blob     = 3
	Tag      = 4
	ofsDelta = 6
	refDelta = 7
)

// typeNames are the names git hashes objects under.
var typeNames = map[int]string{Commit: "commit", Tree: "tree", Blob: "blob", Tag: "tag"}

// OID is an object's SHA-1 name.
type OID [20]byte

func (o OID) String() string { return hex.EncodeToString(o[:]) }

// ParseOID reads a 40-digit hex object name.
func ParseOID(s string) (OID, bool) {
	var o OID
	if len(s) != 40 {
		return o, false
	}
	_, err := hex.Decode(o[:], []byte(s))
	return o, err == nil
}

// Hash is git's name for an object of type typ holding data.
func Hash(typ int, data []byte) OID {
	h := sha1.New()
	fmt.Fprintf(h, "%s %d\x00", typeNames[typ], len(data))
	h.Write(data)
	var o OID
	h.Sum(o[:0])
	return o
}

// Object is one object of a pack, resolved.
type Object struct {
	OID    OID
	Type   int
	Data   []byte
	Offset int64  // of its entry in the pack
	CRC    uint32 // of its entry's bytes, as the index keeps it
}

// Limits bound what a pack may make a reader hold.
type Limits struct {
	Objects int   // entries
	Bytes   int64 // inflated, all objects together (deltas and their results)
}

// Source finds an object a thin pack's delta names but does not carry.
type Source func(OID) (typ int, data []byte, ok bool)

// Pack is a received pack, read and resolved.
type Pack struct {
	Objects []Object
	// Bases are the objects its deltas are against that it does not
	// carry, in the order first needed; Complete appends them.
	Bases []Object
	raw   []byte
}

var errTruncated = errors.New("pack: truncated")

// entry is an entry as read, before its delta (if any) is resolved.
type entry struct {
	typ    int
	off    int64
	end    int64
	data   []byte // inflated: the object, or the delta
	base   int64  // ofs-delta: the base entry's offset
	baseID OID    // ref-delta
}

// Read reads pack b (as a push sends it: header, entries, checksum, and
// nothing after) and resolves every entry, taking the bases of a thin
// pack's deltas from ext.
func Read(b []byte, ext Source, lim Limits) (*Pack, error) {
	if len(b) < 12+20 || string(b[:4]) != "PACK" {
		return nil, errors.New("pack: no pack header")
	}
	if v := binary.BigEndian.Uint32(b[4:]); v != 2 && v != 3 {
		return nil, fmt.Errorf("pack: version %d", v)
	}
	n := int(binary.BigEndian.Uint32(b[8:]))
	if n > lim.Objects {
		return nil, fmt.Errorf("pack: %d objects, more than %d", n, lim.Objects)
	}
	body := b[:len(b)-20]
	if sum := sha1.Sum(body); !bytes.Equal(sum[:], b[len(b)-20:]) {
		return nil, errors.New("pack: checksum mismatch")
	}
	var total int64
	entries := make([]entry, 0, n)
	byOff := make(map[int64]int, n)
	off := int64(12)
	for range n {
		e, err := readEntry(body, off, lim.Bytes-total)
		if err != nil {
			return nil, err
		}
		total += int64(len(e.data))
		byOff[off] = len(entries)
		entries = append(entries, e)
		off = e.end
	}
	if off != int64(len(body)) {
		return nil, errors.New("pack: bytes after its last entry")
	}
	p := &Pack{raw: b, Objects: make([]Object, n)}
	done := make([]bool, n)
	byID := map[OID]int{}
	for i, e := range entries {
		if e.typ < ofsDelta {
			p.Objects[i] = Object{OID: Hash(e.typ, e.data), Type: e.typ, Data: e.data, Offset: e.off}
			done[i] = true
			if _, twice := byID[p.Objects[i].OID]; twice {
				return nil, fmt.Errorf("pack: object %s twice", p.Objects[i].OID)
			}
			byID[p.Objects[i].OID] = i
		}
	}
	external := map[OID]int{}
	// Deltas resolve once their base has: rounds over the unresolved, as
	// many as the longest chain. A ref-delta's base is taken from the
	// pack if any entry is it (git's index-pack does so too), so bases
	// are read from the repository only when a round resolves nothing.
	for left := n - len(byID); left > 0; {
		progress := false
		for i, e := range entries {
			if done[i] {
				continue
			}
			var base *Object
			switch e.typ {
			case ofsDelta:
				j, ok := byOff[e.base]
				if !ok {
					return nil, fmt.Errorf("pack: a delta at %d names no entry as its base", e.off)
				}
				if done[j] {
					base = &p.Objects[j]
				}
			case refDelta:
				if j, ok := byID[e.baseID]; ok {
					base = &p.Objects[j]
				} else if j, ok := external[e.baseID]; ok {
					base = &p.Bases[j]
				}
			}
			if base == nil {
				continue
			}
			data, err := applyDelta(base.Data, e.data, lim.Bytes-total)
			if err != nil {
				return nil, fmt.Errorf("pack: entry at %d: %w", e.off, err)
			}
			total += int64(len(data))
			id := Hash(base.Type, data)
			if _, twice := byID[id]; twice {
				return nil, fmt.Errorf("pack: object %s twice", id)
			}
			if _, twice := external[id]; twice {
				return nil, fmt.Errorf("pack: object %s both in the pack and a base it lacks", id)
			}
			p.Objects[i] = Object{OID: id, Type: base.Type, Data: data, Offset: e.off}
			byID[id] = i
			done[i] = true
			left--
			progress = true
		}
		if progress {
			continue
		}
		for i, e := range entries {
			if done[i] || e.typ != refDelta {
				continue
			}
			if _, ok := external[e.baseID]; ok {
				continue
			}
			typ, data, ok := ext(e.baseID)
			if !ok {
				return nil, fmt.Errorf("pack: a delta's base %s is neither in the pack nor in the repository", e.baseID)
			}
			if Hash(typ, data) != e.baseID {
				return nil, fmt.Errorf("pack: base %s read back under another name", e.baseID)
			}
			if total += int64(len(data)); total > lim.Bytes {
				return nil, errors.New("pack: objects larger than allowed")
			}
			external[e.baseID] = len(p.Bases)
			p.Bases = append(p.Bases, Object{OID: e.baseID, Type: typ, Data: data})
			progress = true
		}
		if !progress {
			return nil, errors.New("pack: deltas that resolve to nothing (a cycle)")
		}
	}
	for i, e := range entries {
		p.Objects[i].CRC = crc32.ChecksumIEEE(body[e.off:e.end])
	}
	return p, nil
}

// readEntry reads the entry at off of body (a pack without its checksum).
func readEntry(body []byte, off, budget int64) (entry, error) {
	e := entry{off: off}
	r := bytes.NewReader(body[off:])
	h, err := readHeader(r, off)
	if err != nil {
		return e, err
	}
	e.typ, e.base, e.baseID = h.typ, h.base, h.baseID
	size := h.size
	if size > uint64(budget) {
		return e, errors.New("pack: objects larger than allowed")
	}
	zr, err := zlib.NewReader(r)
	if err != nil {
		return e, fmt.Errorf("pack: entry at %d: %w", off, err)
	}
	e.data = make([]byte, size)
	if _, err := io.ReadFull(zr, e.data); err != nil {
		return e, fmt.Errorf("pack: entry at %d: %w", off, err)
	}
	// The stream must end where the size says: nothing more, and its
	// checksum read (zlib checks it at EOF).
	if k, err := zr.Read(make([]byte, 1)); k != 0 || err != io.EOF {
		return e, fmt.Errorf("pack: entry at %d inflates past its size", off)
	}
	e.end = int64(len(body)) - int64(r.Len())
	return e, nil
}

// applyDelta applies git's delta d to base.
func applyDelta(base, d []byte, budget int64) ([]byte, error) {
	varint := func() (uint64, bool) {
		var v uint64
		for shift := 0; len(d) > 0 && shift < 64; shift += 7 {
			c := d[0]
			d = d[1:]
			v |= uint64(c&0x7f) << shift
			if c&0x80 == 0 {
				return v, true
			}
		}
		return 0, false
	}
	src, ok1 := varint()
	dst, ok2 := varint()
	if !ok1 || !ok2 || src != uint64(len(base)) {
		return nil, errors.New("delta: bad header")
	}
	if dst > uint64(budget) {
		return nil, errors.New("delta: result larger than allowed")
	}
	out := make([]byte, 0, dst)
	for len(d) > 0 {
		op := d[0]
		d = d[1:]
		switch {
		case op&0x80 != 0:
			var off, size uint64
			for i := range 4 {
				if op&(1<<i) != 0 {
					if len(d) == 0 {
						return nil, errors.New("delta: truncated copy")
					}
					off |= uint64(d[0]) << (8 * i)
					d = d[1:]
				}
			}
			for i := range 3 {
				if op&(0x10<<i) != 0 {
					if len(d) == 0 {
						return nil, errors.New("delta: truncated copy")
					}
					size |= uint64(d[0]) << (8 * i)
					d = d[1:]
				}
			}
			if size == 0 {
				size = 0x10000
			}
			if off+size > uint64(len(base)) || uint64(len(out))+size > dst {
				return nil, errors.New("delta: copy outside its base or result")
			}
			out = append(out, base[off:off+size]...)
		case op != 0:
			if int(op) > len(d) || uint64(len(out))+uint64(op) > dst {
				return nil, errors.New("delta: insert past the delta or result")
			}
			out = append(out, d[:op]...)
			d = d[op:]
		default:
			return nil, errors.New("delta: opcode 0")
		}
	}
	if uint64(len(out)) != dst {
		return nil, errors.New("delta: result shorter than its header says")
	}
	return out, nil
}

// Complete is the pack with its bases appended as whole objects (git's
// index-pack --fix-thin): a pack a repository may keep, all of whose
// deltas resolve within it. Without bases it is the pack as received.
// The objects of the result, with their offsets and CRCs, are returned
// with it.
func (p *Pack) Complete() ([]byte, []Object, error) {
	if len(p.Bases) == 0 {
		return p.raw, p.Objects, nil
	}
	var buf bytes.Buffer
	buf.Write(p.raw[:len(p.raw)-20])
	objs := slices.Clone(p.Objects)
	for _, b := range p.Bases {
		off := int64(buf.Len())
		var hdr []byte
		size := uint64(len(b.Data))
		c := byte(b.Type<<4) | byte(size&15)
		size >>= 4
		for size != 0 {
			hdr = append(hdr, c|0x80)
			c = byte(size & 0x7f)
			size >>= 7
		}
		hdr = append(hdr, c)
		buf.Write(hdr)
		zw := zlib.NewWriter(&buf)
		zw.Write(b.Data)
		if err := zw.Close(); err != nil {
			return nil, nil, err
		}
		b.Offset = off
		b.CRC = crc32.ChecksumIEEE(buf.Bytes()[off:])
		objs = append(objs, b)
	}
	out := buf.Bytes()
	binary.BigEndian.PutUint32(out[8:], uint32(len(objs)))
	sum := sha1.Sum(out)
	return append(out, sum[:]...), objs, nil
}

// Name is git's name for a pack: the hex of its checksum, its last 20
// bytes ("pack-NAME.pack").
func Name(pack []byte) string { return hex.EncodeToString(pack[len(pack)-20:]) }

// Index is the version 2 index of pack holding objs.
func Index(pack []byte, objs []Object) []byte {
	objs = slices.Clone(objs)
	slices.SortFunc(objs, func(a, b Object) int { return bytes.Compare(a.OID[:], b.OID[:]) })
	var b bytes.Buffer
	b.Write([]byte{0xff, 't', 'O', 'c', 0, 0, 0, 2})
	var fan [256]uint32
	for _, o := range objs {
		fan[o.OID[0]]++
	}
	var sum uint32
	for i := range fan {
		sum += fan[i]
		binary.Write(&b, binary.BigEndian, sum)
	}
	for _, o := range objs {
		b.Write(o.OID[:])
	}
	for _, o := range objs {
		binary.Write(&b, binary.BigEndian, o.CRC)
	}
	var large []uint64
	for _, o := range objs {
		if o.Offset < 1<<31 {
			binary.Write(&b, binary.BigEndian, uint32(o.Offset))
		} else {
			binary.Write(&b, binary.BigEndian, uint32(len(large))|1<<31)
			large = append(large, uint64(o.Offset))
		}
	}
	for _, l := range large {
		binary.Write(&b, binary.BigEndian, l)
	}
	b.Write(pack[len(pack)-20:])
	s := sha1.Sum(b.Bytes())
	b.Write(s[:])
	return b.Bytes()
}

// TypeName is the name of object type typ.
func TypeName(typ int) string {
	if n, ok := typeNames[typ]; ok {
		return n
	}
	return strconv.Itoa(typ)
}
