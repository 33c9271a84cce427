//go:build race

package kvevents

import "time"

// promptTextE2EModels are the models of TestE2EPromptTextMatchesEngineTokens:
// one under the race detector (a model load is slow there), both without.
var promptTextE2EModels = []string{"llama3"}

// promptTextE2ETimeout bounds the lookup, which loads the tokenizer (5-15 s
// of CPU under the race detector) and tokenizes the prompt: generous, since
// CI runs two packages' tests at once on two cores.
const promptTextE2ETimeout = 120 * time.Second
