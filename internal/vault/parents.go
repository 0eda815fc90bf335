package vault

import "github.com/atoll-dev/atoll/internal/vault/gitpack"

// maxCommit bounds the commit object read.
const maxCommit = 1 << 20

// quarantineParents returns the parents of commit oid if it is in one of
// the packs a push brought, in its quarantine directory q; ok false
// otherwise. A push of new commits on a branch has its tip there, and
// that tip's parent is most often the branch's old value: the
// fast-forward check then needs no git process (isAncestor runs one for
// every other case).
func quarantineParents(q, oid string) (parents []string, ok bool) {
	id, ok := gitpack.ParseOID(oid)
	if q == "" || !ok {
		return nil, false
	}
	r, err := gitpack.OpenObjects(q)
	if err != nil {
		return nil, false
	}
	defer r.Close()
	typ, data, err := r.Read(id, maxCommit)
	if err != nil || typ != gitpack.Commit {
		return nil, false
	}
	c, err := gitpack.ParseCommit(data)
	if err != nil {
		return nil, false
	}
	for _, p := range c.Parents {
		parents = append(parents, p.String())
	}
	return parents, true
}
