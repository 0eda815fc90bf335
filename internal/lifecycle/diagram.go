package lifecycle

import (
	"fmt"
	"strings"

	"github.com/atoll-dev/atoll/api"
)

// Doc renders the tables as the Markdown docs/lifecycle.md shows between
// its generated markers: a Mermaid state diagram of every transition, and
// a table of every state with whether the API shows it and what recovery
// does with it.
func Doc() string {
	var b strings.Builder
	b.WriteString("```mermaid\nstateDiagram-v2\n")
	fmt.Fprintf(&b, "    state \"any state\" as any\n")
	for _, t := range Transitions {
		fmt.Fprintf(&b, "    %s --> %s: %s\n", node(t.From), node(t.To), t.By)
	}
	b.WriteString("```\n\n")
	b.WriteString("| state | the API shows it | found at start-up |\n|---|---|---|\n")
	for _, st := range States {
		shows := "no (internal)"
		if st.Visible {
			shows = "yes"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", st.Name, shows, st.Recover)
	}
	return b.String()
}

// node is state's name in the diagram: a record made or removed is the
// diagram's start or end.
func node(state string) string {
	switch state {
	case "", api.StateDeleted:
		return "[*]"
	case Any:
		return "any"
	}
	return state
}
