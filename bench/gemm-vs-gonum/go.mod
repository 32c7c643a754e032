module github.com/ferryml/ferry/bench/gemm-vs-gonum

go 1.26

require github.com/ferryml/ferry v0.0.0

require gonum.org/v1/gonum v0.17.0

replace github.com/ferryml/ferry => ../..
