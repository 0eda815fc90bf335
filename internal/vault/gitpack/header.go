package gitpack

import (
	"errors"
	"fmt"
	"io"
)

// header is what precedes an entry's compressed data: the entry's type,
// its inflated size (of the object, or of the delta), and for a delta its
// base: ofs-delta, the base entry's offset in the pack; ref-delta, the
// base's name.
type header struct {
	typ    int
	size   uint64
	base   int64
	baseID OID
}

// byteReader is what readHeader reads from: a pack in memory or a file.
type byteReader interface {
	io.Reader
	io.ByteReader
}

// readHeader reads the header of the entry at off of a pack, leaving r
// at the entry's compressed data.
func readHeader(r byteReader, off int64) (header, error) {
	var h header
	c, err := r.ReadByte()
	if err != nil {
		return h, errTruncated
	}
	h.typ = int(c>>4) & 7
	h.size = uint64(c & 15)
	for shift := 4; c&0x80 != 0; shift += 7 {
		if c, err = r.ReadByte(); err != nil {
			return h, errTruncated
		}
		if shift > 56 {
			return h, errors.New("pack: entry size too large")
		}
		h.size |= uint64(c&0x7f) << shift
	}
	switch h.typ {
	case Commit, Tree, Blob, Tag:
	case ofsDelta:
		c, err := r.ReadByte()
		if err != nil {
			return h, errTruncated
		}
		d := int64(c & 0x7f)
		for c&0x80 != 0 {
			if c, err = r.ReadByte(); err != nil {
				return h, errTruncated
			}
			if d > 1<<50 {
				return h, errors.New("pack: delta offset too large")
			}
			d = (d+1)<<7 | int64(c&0x7f)
		}
		if d <= 0 || d > off {
			return h, errors.New("pack: delta offset outside the pack")
		}
		h.base = off - d
	case refDelta:
		if _, err := io.ReadFull(r, h.baseID[:]); err != nil {
			return h, errTruncated
		}
	default:
		return h, fmt.Errorf("pack: entry of type %d", h.typ)
	}
	return h, nil
}
