//go:build !race

package kvevents

import "time"

// promptTextE2EModels are the models of TestE2EPromptTextMatchesEngineTokens:
// one under the race detector (a model load is slow there), both without.
var promptTextE2EModels = []string{"llama3", "qwen3"}

// promptTextE2ETimeout bounds the lookup, which loads the tokenizer and
// tokenizes the prompt.
const promptTextE2ETimeout = 60 * time.Second
