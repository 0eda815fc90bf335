package api

// The index of a vault's main branch: full-text search and the link graph
// of its Markdown notes (docs/vault.md, "Search and links").

// VaultNote is a Markdown file of a vault as the index reads it: its
// title (frontmatter title, else the file's name without .md) and its
// frontmatter fields.
type VaultNote struct {
	Path    string   `json:"path"`
	Title   string   `json:"title"`
	Type    string   `json:"type,omitempty"`
	Tags    []string `json:"tags,omitempty"`
	Updated string   `json:"updated,omitempty"`
}

// VaultSearchHit is one note found by GET /v1/vaults/{name}/search.
type VaultSearchHit struct {
	VaultNote
	// Snippet is a passage of the note around the matches, which are
	// marked **like this**.
	Snippet string `json:"snippet"`
	// Score is the match's relevance (BM25, title matches weighing more);
	// higher is better, comparable only within one search.
	Score float64 `json:"score"`
}

// VaultSearch is the body of GET /v1/vaults/{name}/search.
type VaultSearch struct {
	// Commit is the commit of the main branch the index was built from:
	// the vault's head when the search began.
	Commit string           `json:"commit,omitempty"`
	Hits   []VaultSearchHit `json:"hits"`
}

// VaultLink is a [[link]] from note From: Target as written (without its
// #heading or |alias), To the path it resolves to, empty when broken.
type VaultLink struct {
	From   string `json:"from"`
	Target string `json:"target"`
	To     string `json:"to,omitempty"`
}

// VaultLinks is the body of GET /v1/vaults/{name}/links: with ?path=,
// the note, its links (broken ones with no To) and its backlinks; without,
// every broken link of the vault.
type VaultLinks struct {
	Commit    string      `json:"commit,omitempty"`
	Note      *VaultNote  `json:"note,omitempty"`
	Links     []VaultLink `json:"links,omitempty"`
	Backlinks []VaultLink `json:"backlinks,omitempty"`
	Broken    []VaultLink `json:"broken,omitempty"`
}
