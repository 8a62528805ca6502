r"""Hand-checked answer cases against GSM8K golds (full solutions ending in ``#### N``) and plain
numeric golds. Each case: (id, completion, gold, expected score, why)."""

NATALIA = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
           "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72")
WENG = ("Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\n"
        "Working 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10")
BETTY = ("In the beginning, Betty has only 100 / 2 = $<<100/2=50>>50.\n"
         "Betty's grandparents gave her 15 * 2 = $<<15*2=30>>30.\n"
         "This means, Betty needs 100 - 50 - 30 - 15 = $<<100-50-30-15=5>>5 more.\n#### 5")
JAMES = ("He writes each friend 3*2=<<3*2=6>>6 pages a week\nSo he writes 6*2=<<6*2=12>>12 pages every week\n"
         "That means he writes 12*52=<<12*52=624>>624 pages a year\n#### 624")
HOUSE = ("The house cost 80,000 + 50,000 = $<<80000+50000=130000>>130,000 after repairs.\n"
         "It increased in value by 80,000 * 1.5 = <<80000*1.5=120000>>120,000.\n"
         "So the new value is 120,000 + 80,000 = $<<120000+80000=200000>>200,000.\n"
         "So he made a profit of 200,000 - 130,000 = $<<200000-130000=70000>>70,000.\n#### 70000")
SALE = "The discount is 20/80 = <<20/80=0.25>>0.25.\nAs a percent that is 0.25 * 100 = <<0.25*100=25>>25%.\n#### 25"
TOYS = "Each toy costs 5/2 = $<<5/2=2.5>>2.5.\n#### 2.5"
COLD = "It starts at 10 degrees and drops by 15 degrees, so 10 - 15 = <<10-15=-5>>-5 degrees.\n#### -5"
HUGE = "Multiply it out.\n#### 123456789012345678901234567890"

CASES = [
    ("gsm8k-tag-bare", "<answer>72</answer>", NATALIA, 1, "the project's tags against a #### gold"),
    ("gsm8k-bare-number", "72", NATALIA, 1, "a bare number"),
    ("gsm8k-own-format", "In May she sold 48/2 = 24, so 48 + 24 = 72.\n#### 72", NATALIA, 1, "GSM8K's own #### line"),
    ("gsm8k-tag-units", "<answer>72 clips</answer>", NATALIA, 1, "a word after the number"),
    ("gsm8k-phrase", "48 + 24 = 72. The answer is 72.", NATALIA, 1, "'the answer is N'"),
    ("gsm8k-phrase-comma", "The answer is 72, since she sold 24 in May.", NATALIA, 1, "phrase cut at ', since'"),
    ("gsm8k-tag-wrong", "<answer>73</answer>", NATALIA, 0, "wrong number"),
    ("gsm8k-tag-or", "<answer>72 or 73</answer>", NATALIA, 0, "two candidates in one tag"),
    ("gsm8k-two-tags-differ", "<answer>72</answer> hmm <answer>24</answer>", NATALIA, 0, "two tags that differ"),
    ("gsm8k-two-tags-same", "<answer>72</answer> so again <answer>72.0</answer>", NATALIA, 1, "two tags that agree"),
    ("gsm8k-answer-rambling", "<answer>72</answer>\nCheck: 48 + 24 = 72, and 24 is half of 48.", NATALIA, 1,
     "the tag decides, not the rambling after it"),
    ("gsm8k-no-answer", "I am not sure how to solve this.", NATALIA, 0, "no answer at all"),
    ("gsm8k-empty", "", NATALIA, 0, "empty completion"),
    ("gsm8k-boxed", "So she sold $\\boxed{72}$ clips.", NATALIA, 1, "a boxed number"),
    ("gsm8k-boxed-decimal", "\\boxed{72.0}", NATALIA, 1, "trailing zero"),
    ("gsm8k-markdown-answer", "**Answer:** 72", NATALIA, 1, "'Answer:' in bold"),
    ("gsm8k-answer-colon-units", "Answer: 72 clips", NATALIA, 1, "'Answer:' with a unit"),
    ("gsm8k-last-number-wrong", "She sold 48 in April and 24 in May.", NATALIA, 0, "the last number is 24"),
    ("gsm8k-phrase-hedge", "the answer is 24 or maybe 72", NATALIA, 0, "two candidates after 'the answer is'"),
    ("gsm8k-hedge-no-marks", "I think it is 72 or 73", NATALIA, 0, "the last two numbers offered as alternatives"),
    ("gsm8k-hedge-same", "<answer>72, or maybe 72</answer>", NATALIA, 1, "the alternatives are one answer"),
    ("gsm8k-hash-then-bonus", "#### 72\n\nBonus fact: 17", NATALIA, 1, "#### decides over a later number"),
    ("gsm8k-two-hashes", "#### 24\n#### 72", NATALIA, 0, "two #### lines that differ"),
    ("gsm8k-heading-hashes", "#### Step 1\n48/2 = 24\n#### Step 2\n48 + 24 = 72\nThe answer is 72.", NATALIA, 1,
     "#### headings are not answers"),
    ("weng-dollar-tag", "<answer>$10</answer>", WENG, 1, "currency sign"),
    ("weng-dollar-cents", "She earned $10.00.", WENG, 1, "currency and trailing zeros, last number"),
    ("weng-hash-dollar", "0.2 x 50 = 10\n#### $10", WENG, 1, "currency after ####"),
    ("weng-dollars-word", "<answer>10 dollars</answer>", WENG, 1, "unit word"),
    ("weng-wrong-cents", "<answer>$10.50</answer>", WENG, 0, "wrong amount"),
    ("weng-escaped-dollar", "<answer>\\$10</answer>", WENG, 1, "LaTeX-escaped dollar"),
    ("weng-arithmetic-tail", "0.2 x 50 = 10", WENG, 1, "the last number of a calculation"),
    ("weng-euro", "<answer>€10</answer>", WENG, 1, "euro sign"),
    ("weng-pound", "<answer>£10.00</answer>", WENG, 1, "pound sign"),
    ("weng-rate-instead", "<answer>0.2</answer>", WENG, 0, "an intermediate value"),
    ("betty-hash", "Betty needs $5 more.\n#### 5", BETTY, 1, "#### line"),
    ("betty-negative", "<answer>-5</answer>", BETTY, 0, "sign matters"),
    ("betty-trailing-zeros", "<answer>5.00</answer>", BETTY, 1, "5.00 is 5"),
    ("betty-fifty", "The answer is 50.", BETTY, 0, "wrong number"),
    ("betty-sentence-tag", "<answer>She needs 5 more dollars</answer>", BETTY, 1, "one number among words"),
    ("james-units", "<answer>624 pages</answer>", JAMES, 1, "unit word"),
    ("james-bad-comma", "<answer>6,24</answer>", JAMES, 0, "'6,24' is not a thousands separator"),
    ("james-calc", "12 * 52 = 624", JAMES, 1, "the result of a calculation"),
    ("james-decimal-wrong", "<answer>62.4</answer>", JAMES, 0, "wrong by a factor of ten"),
    ("james-assignment", "<answer>pages = 12 * 52 = 624</answer>", JAMES, 1, "an equation's right side"),
    ("house-thousands", "<answer>70,000</answer>", HOUSE, 1, "thousands separator"),
    ("house-thousands-dollars", "He made a profit of $70,000.00", HOUSE, 1, "separator, currency, trailing zeros"),
    ("house-wrong", "<answer>$200,000</answer>", HOUSE, 0, "the new value, not the profit"),
    ("house-scientific", "<answer>7e4</answer>", HOUSE, 1, "scientific notation"),
    ("sale-percent", "<answer>25%</answer>", SALE, 1, "percent sign against a percent gold"),
    ("sale-latex-percent", "\\boxed{25\\%}", SALE, 1, "LaTeX percent"),
    ("sale-percent-word", "The answer is 25 percent.", SALE, 1, "percent as a word"),
    ("sale-fraction-of-one", "<answer>0.25</answer>", SALE, 0, "a percent question answered as a fraction of one"),
    ("toys-decimal", "<answer>2.50</answer>", TOYS, 1, "trailing zero"),
    ("toys-fraction", "<answer>5/2</answer>", TOYS, 1, "a fraction equal to the decimal"),
    ("toys-latex-fraction", "<answer>\\frac{5}{2}</answer>", TOYS, 1, "a LaTeX fraction equal to the decimal"),
    ("toys-dollars", "Each toy costs $2.50.", TOYS, 1, "currency, last number"),
    ("toys-rounded", "<answer>3</answer>", TOYS, 0, "rounded"),
    ("cold-negative", "The temperature drops to -5 degrees.", COLD, 1, "negative number, degrees"),
    ("cold-unicode-minus", "<answer>\u22125</answer>", COLD, 1, "unicode minus sign"),
    ("cold-positive", "<answer>5</answer>", COLD, 0, "sign lost"),
    ("cold-degree-sign", "<answer>-5\u00b0</answer>", COLD, 1, "degree sign"),
    ("huge-separators", "<answer>123,456,789,012,345,678,901,234,567,890</answer>", HUGE, 1, "a 30-digit number"),
    ("huge-off-by-one", "<answer>123456789012345678901234567891</answer>", HUGE, 0, "exact, not float, comparison"),
    ("plain-int", "<answer>18</answer>", 18, 1, "an integer gold"),
    ("plain-float", "<answer>18</answer>", 18.0, 1, "a float gold"),
    ("plain-str-dollar", "18", "$18", 1, "a gold with a currency sign"),
    ("plain-half", "<answer>1/2</answer>", 0.5, 1, "a fraction against a float gold"),
    ("plain-wrong", "<answer>17</answer>", 18, 0, "wrong"),
]
