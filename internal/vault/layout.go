package vault

import (
	"fmt"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// layouts are the conventions a vault can be seeded with, by name: the
// files of its first commit. "" is an empty vault.
var layouts = map[string]func(now time.Time) []File{
	"":                   nil,
	api.VaultLayoutAgent: agentLayout,
}

// agentLayout is the agent layout of docs/vault.md: entities/ (one file
// per person, project or system), workflows/ (how things are done),
// timeline/ (raw daily entries, rolled up into weeks and months), and
// index.md, the map. git keeps no empty directories, so each holds a
// README.md that says what goes in it.
func agentLayout(now time.Time) []File {
	day := now.Format("2006-01-02")
	return []File{
		{"index.md", fmt.Sprintf(`---
title: Index
type: index
updated: %s
---
# Index

The map of this memory. Link notes by title or by path in double square brackets,
as below.

- [[entities/README.md]]: people, projects, systems, one file each
- [[workflows/README.md]]: how things are done
- [[timeline/README.md]]: what happened, day by day
`, day)},
		{"entities/README.md", `# Entities

One file per person, project or system, named after it
(entities/ada-lovelace.md), with frontmatter:

    ---
    title: Ada Lovelace
    type: person        # person, project, system, ...
    tags: [math, engines]
    updated: YYYY-MM-DD
    ---
`},
		{"workflows/README.md", `# Workflows

How things are done: one file per procedure, steps and the reasons for
them, linked to the entities they involve.
`},
		{"timeline/README.md", `# Timeline

Raw entries, one file a day: timeline/YYYY/MM/DD.md. Older days are rolled
up into timeline/weekly/YYYY-Www.md and timeline/monthly/YYYY-MM.md; the
raw files stay in the history.
`},
	}
}
