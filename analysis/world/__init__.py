"""The world the demo zoo lives in, on the ground floor: pure functions of a seed, no model, no loader.

`shapes_world`: Shapes World's scenes, captions, claims, language tasks and its word vocabulary (`VOCAB`);
`concepts`: the ground-truth concepts per caption word and image patch; `tokenizer`: the word-level
tokenizer that makes each vocabulary word one token (the zoo's models and the tests' tiny models use it).
The zoo (analysis/zoo/) trains and evaluates models on this world; tasks, panels and fixtures read it.
"""
