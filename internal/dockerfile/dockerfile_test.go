package dockerfile

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

func TestParse(t *testing.T) {
	src := `# syntax comment
ARG BASE=host
FROM ${BASE}
ENV A=1 B="two words" \
    C=3
ENV LEGACY value with spaces
LABEL org.example="x y"
WORKDIR /app
COPY --chown=1000:1000 src/ ./dst/
ADD ["a b.tar", "/opt/"]
RUN apt-get update && \
    apt-get install -y curl
RUN ["python3", "-c", "print(1)"]
USER user
CMD ["python3"]
ENTRYPOINT /bin/sh -c
`
	got, err := Parse(strings.NewReader(src))
	if err != nil {
		t.Fatal(err)
	}
	type brief struct {
		Line  int
		Cmd   string
		Args  []string
		Exec  bool
		Flags map[string]string
	}
	var b []brief
	for _, in := range got {
		b = append(b, brief{in.Line, in.Cmd, in.Args, in.Exec, in.Flags})
	}
	want := []brief{
		{2, "ARG", []string{"BASE", "host"}, false, map[string]string{"default": "yes"}},
		{3, "FROM", []string{"${BASE}"}, false, nil},
		{4, "ENV", []string{"A", "1", "B", "two words", "C", "3"}, false, nil},
		{6, "ENV", []string{"LEGACY", "value with spaces"}, false, nil},
		{7, "LABEL", []string{"org.example", "x y"}, false, nil},
		{8, "WORKDIR", []string{"/app"}, false, nil},
		{9, "COPY", []string{"src/", "./dst/"}, false, map[string]string{"chown": "1000:1000"}},
		{10, "ADD", []string{"a b.tar", "/opt/"}, false, map[string]string{}},
		{11, "RUN", []string{"apt-get update &&     apt-get install -y curl"}, false, nil},
		{13, "RUN", []string{"python3", "-c", "print(1)"}, true, nil},
		{14, "USER", []string{"user"}, false, nil},
		{15, "CMD", []string{"python3"}, true, nil},
		{16, "ENTRYPOINT", []string{"/bin/sh -c"}, false, nil},
	}
	if diff := cmp.Diff(want, b); diff != "" {
		t.Errorf("parse (-want +got):\n%s", diff)
	}
}

func TestParseErrors(t *testing.T) {
	cases := map[string]string{
		"empty":             "",
		"no from":           "RUN true\n",
		"two stages":        "FROM a\nFROM b\n",
		"stage name":        "FROM a AS b\n",
		"unknown":           "FROM a\nHEALTHCHECK NONE\n",
		"copy --from":       "FROM a\nCOPY --from=x a b\n",
		"copy one arg":      "FROM a\nCOPY a\n",
		"run flags":         "FROM a\nRUN --mount=type=cache true\n",
		"bad env":           "FROM a\nENV =x\n",
		"unterminated":      "FROM a\nENV A=\"x\n",
		"empty run":         "FROM a\nRUN\n",
		"instr before from": "WORKDIR /x\nFROM a\n",
	}
	for name, src := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse(strings.NewReader(src)); !errors.Is(err, errdefs.ErrInvalid) {
				t.Errorf("Parse: %v, want invalid", err)
			}
		})
	}
	huge := "FROM a\n" + strings.Repeat("RUN true\n", MaxSize/9+1)
	if _, err := Parse(strings.NewReader(huge)); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("huge Dockerfile: %v", err)
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "x", "EMPTY": "", "PATH": "/bin"}
	cases := map[string]string{
		"$A":               "x",
		"${A}y":            "xy",
		"${MISSING:-dflt}": "dflt",
		"${EMPTY:-dflt}":   "dflt",
		"${A:-dflt}":       "x",
		"${A:+alt}":        "alt",
		"${MISSING:+alt}":  "",
		`\$A`:              "$A",
		"$PATH:/usr/bin":   "/bin:/usr/bin",
		"cost $":           "cost $",
		"$MISSING/end":     "/end",
	}
	for in, want := range cases {
		got, err := Expand(in, vars)
		if err != nil || got != want {
			t.Errorf("Expand(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"${A", "${A:?err}"} {
		if _, err := Expand(bad, vars); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Expand(%q): %v, want invalid", bad, err)
		}
	}
}
