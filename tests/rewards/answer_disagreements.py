"""Where the reference scorers disagree with the hand-checked table: case id -> the reference's
score (None: it skips the row). test_answers.py asserts these are exactly the disagreements, and
docs/answers.md gives the reason for each; a change in either scorer shows up as a failing test."""

TRL = {
    # no LaTeX anchor ($...$ or \boxed{}) in the completion: TRL's call reads no answer
    "gsm8k-tag-bare": 0, "gsm8k-bare-number": 0, "gsm8k-own-format": 0, "gsm8k-tag-units": 0, "gsm8k-phrase": 0,
    "gsm8k-phrase-comma": 0, "gsm8k-two-tags-same": 0, "gsm8k-answer-rambling": 0, "gsm8k-markdown-answer": 0,
    "gsm8k-answer-colon-units": 0, "gsm8k-hedge-same": 0, "gsm8k-hash-then-bonus": 0, "gsm8k-heading-hashes": 0,
    "weng-dollar-tag": 0, "weng-dollar-cents": 0, "weng-hash-dollar": 0, "weng-dollars-word": 0,
    "weng-escaped-dollar": 0, "weng-arithmetic-tail": 0, "weng-euro": 0, "weng-pound": 0, "betty-hash": 0,
    "betty-trailing-zeros": 0, "betty-sentence-tag": 0, "james-units": 0, "james-calc": 0, "james-assignment": 0,
    "house-thousands": 0, "house-thousands-dollars": 0, "house-scientific": 0, "sale-percent": 0,
    "sale-percent-word": 0, "toys-decimal": 0, "toys-fraction": 0, "toys-dollars": 0, "cold-negative": 0,
    "cold-unicode-minus": 0, "cold-degree-sign": 0, "huge-separators": 0, "plain-int": 0, "plain-float": 0,
    "plain-str-dollar": 0, "plain-half": 0, "math-frac-slash-tag": 0, "math-frac-last-number": 0,
    "math-neg-unicode": 0, "math-degrees-sign": 0, "math-percent-plain": 0, "math-thousands-comma": 0,
    "math-thin-space": 0, "math-third-slash": 0, "math-sci-separators": 0, "tag-think-answer": 0,
    "tag-phrase-inside": 0, "tag-assignment": 0, "tag-unclosed": 0, "tag-upper-case": 0, "tag-hedge-outside": 0,
    "tag-full-stop": 0, "tag-it-is": 0, "tag-maybe-single": 0, "phrase-final-answer": 0, "phrase-is-colon": 0,
    "phrase-then-rambling": 0, "last-number-calc": 0, "phrase-introduces-reasoning": 0, "phrase-answer-colon-sum": 0,
    "think-phrase-inside-ignored": 0, "think-unclosed": 0, "phrase-corrected": 0, "phrase-step-heading": 0,
    # LaTeX without braces (\dfrac34, \sqrt 3) that TRL's call does not turn into an expression
    "math-dfrac-nobraces": 0, "math-sqrt-spaces": 0,
    # math-verify compares floats rounded to 6 digits: 0.3333333 passes as 1/3
    "math-third-long-approx": 1,
    # \boxed {5} with a space is not read as a box
    "math-five-boxed-space": 0,
    # a text (or tagged) gold math-verify cannot parse: TRL skips the row (None)
    "tag-over-tags": None, "text-paris": None, "text-paris-or-lyon": None, "text-spaces": None, "text-anagram":
    None, "text-wrong": None,
    # TRL reads the box; the answer tags, which come first here, are not read
    "tag-boxed-outside-ignored": 0,
}

VERL_GSM8K = {
    # no '#### N' line in the completion: the strict rule reads no answer
    "gsm8k-tag-bare": 0, "gsm8k-bare-number": 0, "gsm8k-tag-units": 0, "gsm8k-phrase": 0, "gsm8k-phrase-comma": 0,
    "gsm8k-two-tags-same": 0, "gsm8k-answer-rambling": 0, "gsm8k-boxed": 0, "gsm8k-boxed-decimal": 0,
    "gsm8k-markdown-answer": 0, "gsm8k-answer-colon-units": 0, "gsm8k-hedge-same": 0, "weng-dollar-tag": 0,
    "weng-dollar-cents": 0, "weng-dollars-word": 0, "weng-escaped-dollar": 0, "weng-arithmetic-tail": 0,
    "weng-euro": 0, "weng-pound": 0, "betty-trailing-zeros": 0, "betty-sentence-tag": 0, "james-units": 0,
    "james-calc": 0, "james-assignment": 0, "house-thousands": 0, "house-thousands-dollars": 0, "house-scientific":
    0, "sale-percent": 0, "sale-latex-percent": 0, "sale-percent-word": 0, "toys-decimal": 0, "toys-fraction": 0,
    "toys-latex-fraction": 0, "toys-dollars": 0, "cold-negative": 0, "cold-unicode-minus": 0, "cold-degree-sign": 0,
    "huge-separators": 0,
    # the last #### line counts; two different ones are not refused
    "gsm8k-two-hashes": 1,
    # '#### Step 1' headings, and no #### answer line
    "gsm8k-heading-hashes": 0,
    # '#### $10': the rule wants a digit right after '#### '
    "weng-hash-dollar": 0,
}
