// Package dockerfile parses the Dockerfile subset atoll builds templates from:
// FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, CMD, ENTRYPOINT and LABEL, with
// line continuations, comments, exec (JSON) and shell forms, and variable
// substitution where Docker applies it. Anything else is a clear error rather
// than silently ignored.
package dockerfile

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Instruction is one parsed instruction.
type Instruction struct {
	Line  int               // 1-based line where it starts
	Cmd   string            // upper case: FROM, RUN, ...
	Args  []string          // see Parse for each instruction's shape
	Exec  bool              // RUN/CMD/ENTRYPOINT given in exec (JSON) form
	Flags map[string]string // --chown, --chmod for COPY and ADD
	Text  string            // the instruction as written, continuations joined
}

var supported = map[string]bool{
	"FROM": true, "RUN": true, "COPY": true, "ADD": true, "ENV": true, "ARG": true,
	"WORKDIR": true, "USER": true, "CMD": true, "ENTRYPOINT": true, "LABEL": true,
}

// MaxSize bounds the Dockerfiles Parse reads.
const MaxSize = 1 << 20

// Parse reads a Dockerfile. Argument shapes:
//   - FROM: [image] (an "AS name" stage name is refused: one stage only)
//   - RUN, CMD, ENTRYPOINT: the argv in exec form, or [shell string]
//   - COPY, ADD: sources..., destination (last)
//   - ENV, LABEL: key, value, key, value...
//   - ARG: name, default (default may be empty: Flags["default"] says whether given)
//   - WORKDIR, USER: [value]
//
// Variables are not substituted here; see Expand.
func Parse(r io.Reader) ([]Instruction, error) {
	br := bufio.NewReader(io.LimitReader(r, MaxSize+1))
	var out []Instruction
	var cur strings.Builder
	start, lineNo := 0, 0
	total := 0
	for {
		line, err := br.ReadString('\n')
		if line == "" && err != nil {
			break
		}
		total += len(line)
		if total > MaxSize {
			return nil, fmt.Errorf("%w: Dockerfile is larger than %d bytes", errdefs.ErrTooLarge, MaxSize)
		}
		lineNo++
		line = strings.TrimRight(line, "\r\n")
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = lineNo
		}
		if strings.HasSuffix(line, "\\") {
			// As Docker: the backslash and the newline go, nothing is added.
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			continue
		}
		cur.WriteString(line)
		ins, perr := parseLine(start, cur.String())
		if perr != nil {
			return nil, perr
		}
		out = append(out, ins)
		cur.Reset()
		if err != nil {
			break
		}
	}
	if cur.Len() > 0 {
		ins, err := parseLine(start, cur.String())
		if err != nil {
			return nil, err
		}
		out = append(out, ins)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: empty Dockerfile", errdefs.ErrInvalid)
	}
	seenFrom := false
	for _, ins := range out {
		if ins.Cmd == "FROM" {
			if seenFrom {
				return nil, errAt(ins.Line, "only one FROM is supported (no multi-stage builds)")
			}
			seenFrom = true
		} else if !seenFrom && ins.Cmd != "ARG" {
			return nil, errAt(ins.Line, "%s before FROM", ins.Cmd)
		}
	}
	if !seenFrom {
		return nil, fmt.Errorf("%w: no FROM instruction", errdefs.ErrInvalid)
	}
	return out, nil
}

func errAt(line int, format string, args ...any) error {
	return fmt.Errorf("%w: Dockerfile line %d: "+format, append([]any{errdefs.ErrInvalid, line}, args...)...)
}

func parseLine(line int, text string) (Instruction, error) {
	text = strings.TrimSpace(text)
	word, rest, _ := strings.Cut(text, " ")
	cmd := strings.ToUpper(word)
	rest = strings.TrimSpace(rest)
	ins := Instruction{Line: line, Cmd: cmd, Text: text}
	if !supported[cmd] {
		return ins, errAt(line, "unsupported instruction %s", word)
	}
	if strings.ContainsRune(text, 0) {
		return ins, errAt(line, "NUL byte")
	}
	switch cmd {
	case "FROM":
		f := strings.Fields(rest)
		if len(f) == 0 {
			return ins, errAt(line, "FROM needs an image")
		}
		if strings.HasPrefix(f[0], "--") {
			return ins, errAt(line, "FROM flags are not supported")
		}
		if len(f) != 1 {
			return ins, errAt(line, "FROM takes one image (no AS stages)")
		}
		ins.Args = f
	case "RUN", "CMD", "ENTRYPOINT":
		if rest == "" {
			return ins, errAt(line, "%s needs a command", cmd)
		}
		if cmd == "RUN" && strings.HasPrefix(rest, "--") {
			return ins, errAt(line, "RUN flags are not supported")
		}
		if strings.HasPrefix(rest, "[") {
			var argv []string
			if err := json.Unmarshal([]byte(rest), &argv); err == nil {
				if len(argv) == 0 && cmd == "RUN" {
					return ins, errAt(line, "RUN needs a command")
				}
				ins.Args, ins.Exec = argv, true
				break
			}
		}
		ins.Args = []string{rest}
	case "COPY", "ADD":
		ins.Flags = map[string]string{}
		for strings.HasPrefix(rest, "--") {
			flag, after, _ := strings.Cut(rest, " ")
			k, v, ok := strings.Cut(strings.TrimPrefix(flag, "--"), "=")
			if !ok || (k != "chown" && k != "chmod") {
				return ins, errAt(line, "%s flag %s is not supported (only --chown and --chmod)", cmd, flag)
			}
			ins.Flags[k] = v
			rest = strings.TrimSpace(after)
		}
		var args []string
		if strings.HasPrefix(rest, "[") {
			if err := json.Unmarshal([]byte(rest), &args); err != nil {
				return ins, errAt(line, "malformed JSON form")
			}
		} else {
			args = strings.Fields(rest)
		}
		if len(args) < 2 {
			return ins, errAt(line, "%s needs a source and a destination", cmd)
		}
		ins.Args = args
	case "ENV", "LABEL":
		pairs, err := keyValues(rest, cmd == "ENV")
		if err != nil {
			return ins, errAt(line, "%s: %v", cmd, err)
		}
		ins.Args = pairs
	case "ARG":
		name, def, has := strings.Cut(rest, "=")
		if name == "" || strings.ContainsAny(name, " \t") {
			return ins, errAt(line, "ARG needs one name")
		}
		ins.Args = []string{name, unquote(def)}
		ins.Flags = map[string]string{}
		if has {
			ins.Flags["default"] = "yes"
		}
	case "WORKDIR", "USER":
		if rest == "" {
			return ins, errAt(line, "%s needs a value", cmd)
		}
		ins.Args = []string{rest}
	}
	return ins, nil
}

// keyValues splits `k=v k2="v 2"` (or, for ENV, the legacy `k v w`).
func keyValues(s string, legacy bool) ([]string, error) {
	if s == "" {
		return nil, fmt.Errorf("needs key=value")
	}
	words, err := splitWords(s)
	if err != nil {
		return nil, err
	}
	if !strings.Contains(words[0], "=") {
		if !legacy || len(words) < 2 {
			return nil, fmt.Errorf("needs key=value")
		}
		k, v, _ := strings.Cut(s, " ")
		return []string{k, strings.TrimSpace(v)}, nil
	}
	var out []string
	for _, w := range words {
		k, v, ok := strings.Cut(w, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", w)
		}
		out = append(out, k, v)
	}
	return out, nil
}

// splitWords splits on blanks outside quotes and removes the quotes.
func splitWords(s string) ([]string, error) {
	var out []string
	var cur strings.Builder
	quote := rune(0)
	escaped, inWord := false, false
	for _, r := range s {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\' && quote != '\'':
			escaped = true
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '"' || r == '\'':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated quote")
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

func unquote(s string) string {
	if len(s) >= 2 && (s[0] == '"' && s[len(s)-1] == '"' || s[0] == '\'' && s[len(s)-1] == '\'') {
		return s[1 : len(s)-1]
	}
	return s
}

// Expand substitutes $VAR, ${VAR}, ${VAR:-default} and ${VAR:+alternative}
// from vars, as Docker does in FROM, COPY, ADD, ENV, WORKDIR, USER and LABEL.
// Unknown variables become empty. "\$" is a literal dollar.
func Expand(s string, vars map[string]string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\\' && i+1 < len(s) && s[i+1] == '$' {
			b.WriteByte('$')
			i++
			continue
		}
		if c != '$' || i+1 == len(s) {
			b.WriteByte(c)
			continue
		}
		if s[i+1] == '{' {
			end := strings.IndexByte(s[i:], '}')
			if end < 0 {
				return "", fmt.Errorf("%w: unterminated ${ in %q", errdefs.ErrInvalid, s)
			}
			expr := s[i+2 : i+end]
			i += end
			name, mod, arg := expr, "", ""
			if k := strings.Index(expr, ":"); k >= 0 {
				name, mod = expr[:k], expr[k:]
				if len(mod) < 2 || (mod[1] != '-' && mod[1] != '+') {
					return "", fmt.Errorf("%w: unsupported substitution ${%s}", errdefs.ErrInvalid, expr)
				}
				arg, mod = mod[2:], mod[:2]
			}
			v, ok := vars[name]
			switch {
			case mod == ":-" && (!ok || v == ""):
				v = arg
			case mod == ":+":
				if ok && v != "" {
					v = arg
				} else {
					v = ""
				}
			}
			b.WriteString(v)
			continue
		}
		j := i + 1
		for j < len(s) && (s[j] == '_' || s[j] >= 'a' && s[j] <= 'z' || s[j] >= 'A' && s[j] <= 'Z' || s[j] >= '0' && s[j] <= '9') {
			j++
		}
		if j == i+1 {
			b.WriteByte('$')
			continue
		}
		b.WriteString(vars[s[i+1:j]])
		i = j - 1
	}
	return b.String(), nil
}
