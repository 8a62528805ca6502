r"""Hand-checked answer cases against MATH golds (full solutions whose last ``\boxed{}`` is the
answer). Each case: (id, completion, gold, expected score, why)."""

SUM = r"We have $\frac{1}{2} + \frac{1}{4} = \frac{3}{4}$, so the answer is $\boxed{\frac{3}{4}}$."
ROOT = r"Since $\sqrt{12} = \sqrt{4 \cdot 3}$, we get $\boxed{2\sqrt{3}}$."
AREA = r"The area is $\pi r^2 = \pi \cdot 2^2 = \boxed{4\pi}$."
INTERVAL = r"The inequality holds for $x \le 3$, that is $x \in \boxed{(-\infty, 3]}$."
SET = r"The roots are $1$, $2$ and $3$, so the set is $\boxed{\{1, 2, 3\}}$."
NEG = r"Solving $2x + 1 = 0$ gives $x = \boxed{-\frac{1}{2}}$."
POLY = r"Expanding, $(x - 1)(x + 1) + 2 = \boxed{x^2 + 1}$."
ANGLE = r"Each angle of the square's diagonal is $\boxed{45^\circ}$."
CHOICE = r"Only option C satisfies both conditions, so the answer is $\boxed{\text{(C)}}$."
PERCENT = r"The price rose by $\frac{10}{50} = 20\%$, so $\boxed{20\%}$."
BIG = r"There are $10 \cdot 1000 = \boxed{10{,}000}$ ways."
THIN = r"The total is $\boxed{1,\!000}$."
POINT = r"In polar coordinates the point is $\boxed{\left( 3, \frac{\pi}{2} \right)}$."
LINE = r"The slope is 2 and the intercept 3, so the line is $\boxed{y = 2x + 3}$."
THIRD = r"The probability is $\boxed{\frac{1}{3}}$."
EIGHTH = r"The probability is $\frac{1}{2} \cdot \frac{1}{4} = \boxed{\frac{1}{8}}$."
SQUARE = r"Factor: $x^2 + 2x + 1$, so $\boxed{x^2+2x+1}$."
FIVE = r"Thus $x = \boxed{5}$."
PAIR = r"The solutions are $\boxed{-2, 3}$."
SCI = r"The distance is $\boxed{1200000000000}$ meters."
RATIONALISED = r"Rationalising, $\frac{1}{\sqrt{2}} = \boxed{\frac{\sqrt{2}}{2}}$."

CASES = [
    ("math-frac-boxed", r"So the sum is $\boxed{\frac{3}{4}}$.", SUM, 1, "same fraction"),
    ("math-frac-decimal", r"\boxed{0.75}", SUM, 1, "a decimal equal to the fraction"),
    ("math-dfrac-nobraces", r"\boxed{\dfrac34}", SUM, 1, r"\dfrac without braces"),
    ("math-frac-slash-tag", "<answer>3/4</answer>", SUM, 1, "a slash fraction in the tags"),
    ("math-frac-unreduced", r"\boxed{\frac{6}{8}}", SUM, 1, "an unreduced fraction"),
    ("math-frac-wrong-decimal", r"\boxed{0.7}", SUM, 0, "a wrong decimal"),
    ("math-frac-inverted", r"\boxed{\frac{4}{3}}", SUM, 0, "the inverse"),
    ("math-frac-tfrac", r"\boxed{\tfrac{3}{4}}", SUM, 1, r"\tfrac"),
    ("math-frac-last-number", "so the sum is 3/4", SUM, 1, "a slash fraction as the last number"),
    ("math-sqrt-same", r"\boxed{2\sqrt{3}}", ROOT, 1, "same radical"),
    ("math-sqrt-unsimplified", r"\boxed{\sqrt{12}}", ROOT, 1, "an unsimplified radical"),
    ("math-sqrt-spaces", r"\boxed{2 \sqrt 3}", ROOT, 1, "spaces, no braces"),
    ("math-sqrt-approx", r"\boxed{3.464}", ROOT, 0, "an approximation is not exact"),
    ("math-sqrt-wrong", r"\boxed{\sqrt{3}}", ROOT, 0, "factor lost"),
    ("math-pi-space", r"\boxed{4 \pi}", AREA, 1, "space before pi"),
    ("math-pi-approx", r"\boxed{12.566}", AREA, 0, "an approximation of 4 pi"),
    ("math-pi-units", r"\boxed{4\pi \text{ cm}^2}", AREA, 1, "units in \\text{}"),
    ("math-pi-wrong", r"\boxed{2\pi}", AREA, 0, "the circumference's factor"),
    ("math-interval-spaces", r"\boxed{(-\infty,3]}", INTERVAL, 1, "same interval, no space"),
    ("math-interval-open", r"\boxed{(-\infty, 3)}", INTERVAL, 0, "open where it is closed"),
    ("math-interval-left-right", r"\boxed{\left(-\infty, 3\right]}", INTERVAL, 1, r"\left and \right"),
    ("math-set-order", r"\boxed{\{3,2,1\}}", SET, 1, "a set in another order"),
    ("math-set-missing", r"\boxed{\{1,2\}}", SET, 0, "an element missing"),
    ("math-neg-decimal", r"\boxed{-0.5}", NEG, 1, "a negative decimal"),
    ("math-neg-sign-lost", r"\boxed{\frac{1}{2}}", NEG, 0, "sign lost"),
    ("math-neg-dfrac", r"\boxed{-\dfrac{1}{2}}", NEG, 1, r"\dfrac with a minus"),
    ("math-neg-numerator", r"\boxed{\frac{-1}{2}}", NEG, 1, "the minus in the numerator"),
    ("math-neg-unicode", "<answer>\u22121/2</answer>", NEG, 1, "unicode minus, slash fraction"),
    ("math-neg-assignment", r"\boxed{x = -\frac{1}{2}}", NEG, 1, "an assignment to x"),
    ("math-poly-commuted", r"\boxed{1+x^2}", POLY, 1, "terms in another order"),
    ("math-poly-wrong", r"\boxed{x^2 - 1}", POLY, 0, "wrong constant"),
    ("math-poly-spaces", r"The answer is $x^{2} + 1$.", POLY, 1, "braced exponent, answer phrase"),
    ("math-square-factored", r"\boxed{(x+1)^2}", SQUARE, 1, "factored form of the same polynomial"),
    ("math-square-wrong", r"\boxed{(x-1)^2}", SQUARE, 0, "wrong sign"),
    ("math-degrees-bare", r"\boxed{45}", ANGLE, 1, "degrees dropped"),
    ("math-degrees-sign", "<answer>45\u00b0</answer>", ANGLE, 1, "degree sign"),
    ("math-degrees-braced", r"\boxed{45^{\circ}}", ANGLE, 1, r"^{\circ}"),
    ("math-degrees-wrong", r"\boxed{90^\circ}", ANGLE, 0, "wrong angle"),
    ("math-choice-same", r"\boxed{\text{(C)}}", CHOICE, 1, "same choice"),
    ("math-choice-bare", r"\boxed{(C)}", CHOICE, 1, r"without \text{}"),
    ("math-choice-wrong", r"\boxed{\text{(D)}}", CHOICE, 0, "another choice"),
    ("math-percent-bare", r"\boxed{20}", PERCENT, 1, "percent sign dropped"),
    ("math-percent-plain", "<answer>20%</answer>", PERCENT, 1, "plain percent sign"),
    ("math-percent-wrong", r"\boxed{10\%}", PERCENT, 0, "wrong percent"),
    ("math-thousands-plain", r"\boxed{10000}", BIG, 1, "{,} separator in the gold"),
    ("math-thousands-comma", "<answer>10,000</answer>", BIG, 1, "comma separator"),
    ("math-thousands-wrong", r"\boxed{1000}", BIG, 0, "a zero short"),
    ("math-thin-space", "1000", THIN, 1, r",\! separator in the gold"),
    ("math-point-plain", r"\boxed{(3, \frac{\pi}{2})}", POINT, 1, r"a point without \left/\right"),
    ("math-point-wrong", r"\boxed{(3, \pi)}", POINT, 0, "wrong angle"),
    ("math-line-same", r"\boxed{y=2x+3}", LINE, 1, "the same equation"),
    ("math-line-rhs", r"\boxed{2x+3}", LINE, 1, "the equation's right side"),
    ("math-line-wrong", r"\boxed{y = 3x + 2}", LINE, 0, "slope and intercept swapped"),
    ("math-third-approx", r"\boxed{0.333}", THIRD, 0, "an approximation of 1/3"),
    ("math-third-long-approx", r"\boxed{0.3333333}", THIRD, 0, "a closer approximation is still not 1/3"),
    ("math-third-slash", "<answer>1/3</answer>", THIRD, 1, "slash fraction"),
    ("math-eighth-decimal", r"\boxed{0.125}", EIGHTH, 1, "an exact decimal"),
    ("math-eighth-gold-plain", r"\boxed{\frac{1}{8}}", "0.125", 1, "a decimal gold"),
    ("math-five-assignment", r"\boxed{x=5}", FIVE, 1, "an assignment to x"),
    ("math-five-two-boxes", r"First \boxed{3}, no wait, \boxed{5}", FIVE, 0, "two boxes that differ"),
    ("math-five-boxes-agree", r"\boxed{5} and again \boxed{5.0}", FIVE, 1, "two boxes that agree"),
    ("math-five-nested", r"\boxed{\boxed{5}}", FIVE, 1, "a box in a box"),
    ("math-five-text-or", r"\boxed{5 \text{ or } 6}", FIVE, 0, "alternatives inside a box"),
    ("math-five-unclosed-phrase", r"The answer is \boxed{5", FIVE, 0, "cut off inside the box: no answer"),
    ("math-five-boxed-space", r"\boxed {5}", FIVE, 1, r"a space after \boxed"),
    ("math-pair-same", r"\boxed{-2, 3}", PAIR, 1, "the same list"),
    ("math-pair-swapped", r"\boxed{3, -2}", PAIR, 1, "the list in another order"),
    ("math-pair-one", r"\boxed{3}", PAIR, 0, "a root missing"),
    ("math-sci-times", r"\boxed{1.2 \times 10^{12}}", SCI, 1, "scientific notation in LaTeX"),
    ("math-sci-separators", "<answer>1,200,000,000,000 meters</answer>", SCI, 1, "separators and units"),
    ("math-rationalised", r"\boxed{\frac{1}{\sqrt{2}}}", RATIONALISED, 1, "not rationalised, same value"),
    ("math-rationalised-decimal", r"\boxed{0.7071}", RATIONALISED, 0, "an approximation"),
]
