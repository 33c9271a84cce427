package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Output formats of Write.
const (
	FormatHuman = "human"
	FormatJSON  = "json"
	FormatTable = "table"
)

// Write renders r in format (FormatHuman, FormatJSON or FormatTable).
func Write(w io.Writer, r *Report, format string) error {
	switch format {
	case FormatHuman:
		return writeHuman(w, r)
	case FormatJSON:
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(r)
	case FormatTable:
		return writeTable(w, r)
	}
	return fmt.Errorf("doctor: unknown output format %q (want human, json or table)", format)
}

// writeHuman prints one line per finding, grouped by the code's hundred, a
// "fix:" line under each WARN and FAIL, and a summary.
func writeHuman(w io.Writer, r *Report) error {
	var b strings.Builder
	group := ""
	for _, f := range r.Findings {
		if g := groupOf(f.Code); g != group {
			if group != "" {
				b.WriteByte('\n')
			}
			group = g
			b.WriteString(g + "\n")
		}
		fmt.Fprintf(&b, "  %-6s %s %-*s ", "["+f.Severity.String()+"]", f.Code, titleWidth, f.Check)
		if f.Object != "" {
			b.WriteString(f.Object + ": ")
		}
		b.WriteString(f.Message + "\n")
		if f.Fix != "" {
			fmt.Fprintf(&b, "%14sfix: %s\n", "", f.Fix)
		}
	}
	if len(r.Findings) > 0 {
		b.WriteByte('\n')
	}
	s := r.Summary
	fmt.Fprintf(&b, "%d OK, %d INFO, %d WARN, %d FAIL in %s: exit %d\n",
		s.OK, s.Info, s.Warn, s.Fail, r.Duration.Round(time.Millisecond), r.ExitCode)
	_, err := io.WriteString(w, b.String())
	return err
}

// titleWidth is the longest check name, so human messages line up.
var titleWidth = func() int {
	w := 0
	for _, c := range allCodes {
		w = max(w, len(c.Title))
	}
	return w
}()

func groupOf(code string) string {
	switch {
	case strings.HasPrefix(code, "IC1"):
		return "Data plane"
	case strings.HasPrefix(code, "IC2"):
		return "Cluster"
	}
	return "Other"
}

func writeTable(w io.Writer, r *Report) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEVERITY\tCODE\tCHECK\tOBJECT\tMESSAGE")
	for _, f := range r.Findings {
		obj := f.Object
		if obj == "" {
			obj = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", f.Severity, f.Code, f.Check, obj, f.Message)
	}
	return tw.Flush()
}
