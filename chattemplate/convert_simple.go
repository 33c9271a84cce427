package chattemplate

import "github.com/ardanlabs/jinja"

// convertSimple is ConvertMessage's fast path for the messages most of a
// conversation is made of, in the string content format: an object whose
// members are "role" (not "developer"), "content" (a string or null),
// "tool_call_id" and "name", each a string and each at most once. It
// reads raw once and builds only the result, where the general path
// decodes the whole message into template values first; ok is false for
// any other message, which then takes the general path (the result is
// the same: TestConvertSimpleMatchesGeneral, FuzzConvertSimple).
func convertSimple(raw []byte) (v jinja.Value, ok bool) {
	const (
		role = iota
		content
		toolCallID
		name
	)
	var vals [4]string
	var have [4]bool
	d := jsonDecoder{s: raw}
	d.skipSpace()
	if d.i >= len(d.s) || d.s[d.i] != '{' {
		return v, false
	}
	d.i++
	for {
		d.skipSpace()
		if d.i >= len(d.s) || d.s[d.i] != '"' {
			return v, false
		}
		k, err := d.str()
		if err != nil {
			return v, false
		}
		f := -1
		switch k {
		case "role":
			f = role
		case "content":
			f = content
		case "tool_call_id":
			f = toolCallID
		case "name":
			f = name
		}
		if f < 0 || have[f] {
			return v, false
		}
		have[f] = true
		d.skipSpace()
		if d.i >= len(d.s) || d.s[d.i] != ':' {
			return v, false
		}
		d.i++
		d.skipSpace()
		switch {
		case d.i < len(d.s) && d.s[d.i] == '"':
			if vals[f], err = d.str(); err != nil {
				return v, false
			}
		case f == content && len(d.s)-d.i >= 4 && string(d.s[d.i:d.i+4]) == "null":
			d.i += 4 // null content is "" in the string format
		default:
			return v, false
		}
		d.skipSpace()
		if d.i >= len(d.s) {
			return v, false
		}
		d.i++
		if d.s[d.i-1] == '}' {
			break
		}
		if d.s[d.i-1] != ',' {
			return v, false
		}
	}
	d.skipSpace()
	if d.i != len(d.s) || !have[role] || vals[role] == "developer" {
		return v, false
	}
	v = jinja.NewDict()
	o := v.AsDict()
	o.Set("role", jinja.NewString(vals[role]))
	o.Set("content", jinja.NewString(vals[content]))
	if have[toolCallID] && vals[role] == "tool" {
		o.Set("tool_call_id", jinja.NewString(vals[toolCallID]))
	}
	if have[name] {
		o.Set("name", jinja.NewString(vals[name]))
	}
	return v, true
}
