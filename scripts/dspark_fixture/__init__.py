"""The DSpark drafter fixture: built on a published fixture build (its ``target``), into
``<build>/dspark/`` with its own hash, so that the base and full builds keep theirs."""
