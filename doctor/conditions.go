package doctor

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// judgedGeneration is the metadata.generation a condition was written for:
// its own observedGeneration, or, when it carries none (the field is
// optional), the status's.
func judgedGeneration(c *metav1.Condition, statusGen int64) int64 {
	if c.ObservedGeneration > 0 {
		return c.ObservedGeneration
	}
	return statusGen
}

// splitConditions separates the conditions about generation gen (current)
// from those written for an earlier spec (stale). A stale condition says
// nothing about the object as it is now, so the checks judge current only
// and report stale as such.
func splitConditions(conds []metav1.Condition, gen, statusGen int64) (current, stale []metav1.Condition) {
	for i := range conds {
		if judgedGeneration(&conds[i], statusGen) < gen {
			stale = append(stale, conds[i])
		} else {
			current = append(current, conds[i])
		}
	}
	return current, stale
}

// describeStale lists stale conditions with the generation each judged:
// "Ready=True Available (generation 1), Degraded=False (generation 1)".
func describeStale(stale []metav1.Condition, statusGen int64) string {
	parts := make([]string, len(stale))
	for i := range stale {
		c := &stale[i]
		s := c.Type + "=" + string(c.Status)
		if c.Reason != "" {
			s += " " + c.Reason
		}
		parts[i] = fmt.Sprintf("%s (generation %d)", s, judgedGeneration(c, statusGen))
	}
	return strings.Join(parts, ", ")
}

// reportStale adds the IC203 finding of an object with stale conditions.
func reportStale(fs *findings, obj string, stale []metav1.Condition, gen, statusGen int64) {
	if len(stale) == 0 {
		return
	}
	fs.add(CodeStaleCondition, Warn, obj, "spec is at generation %d; not judged, stale: %s", gen, describeStale(stale, statusGen))
}

// hasType reports whether conds holds a condition of type typ.
func hasType(conds []metav1.Condition, typ string) bool {
	for i := range conds {
		if conds[i].Type == typ {
			return true
		}
	}
	return false
}

// nameList joins up to limit names, then says how many more there are.
func nameList(names []string, limit int) string {
	if len(names) <= limit {
		return strings.Join(names, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(names[:limit], ", "), len(names)-limit)
}
