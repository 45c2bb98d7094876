package kernels

import "math"

// The transcendental functions the kernels use, in float64, with the same
// bits on every platform. Go's math.Exp is not: on amd64 and arm64 it runs
// assembly that uses fused multiply-adds where the CPU has them, and the
// compiler may fuse x*y + z in math.Erf's polynomials on arm64, ppc64le,
// s390x and amd64 v3. These are the algorithms of FreeBSD's msun that Go's
// portable code uses, with every product that feeds a sum rounded on its
// own (the float64(x*y) conversion forbids fusing), so a tenant's reference
// reproduces a kernel's results bit for bit. exp stays within 1 ulp of
// the exact value (checked against e^x to 256 bits); Go's amd64 math.Exp
// does not always (1.3 ulp at 148), so the two may differ by 2 ulp.

// poly returns c[0] + x*(c[1] + x*(c[2] + ...)), Horner's rule from the
// highest coefficient, every product rounded before its sum.
func poly(x float64, c []float64) float64 {
	s := c[len(c)-1]
	for i := len(c) - 2; i >= 0; i-- {
		s = c[i] + float64(x*s)
	}
	return s
}

// The coefficients of e_exp.c's remez polynomial.
const (
	expP1 = 1.66666666666666657415e-01
	expP2 = -2.77777777770155933842e-03
	expP3 = 6.61375632143793436117e-05
	expP4 = -1.65339022054652515390e-06
	expP5 = 4.13813679705723846039e-08
)

// exp returns e^x.
func exp(x float64) float64 {
	const (
		ln2Hi     = 6.93147180369123816490e-01
		ln2Lo     = 1.90821492927058770002e-10
		log2e     = 1.44269504088896338700e+00
		overflow  = 7.09782712893383973096e+02
		underflow = -7.45133219101941108420e+02
		nearZero  = 1.0 / (1 << 28)
	)
	switch {
	case x != x:
		return x
	case x > overflow:
		return math.Inf(1)
	case x < underflow:
		return 0
	case -nearZero < x && x < nearZero:
		return 1 + x
	}
	// x = k·ln2 + r with |r| ≤ ln2/2, r carried as hi - lo for precision.
	k := int(float64(log2e*x) + math.Copysign(0.5, x))
	hi := x - float64(float64(k)*ln2Hi)
	lo := float64(float64(k) * ln2Lo)
	r := hi - lo
	t := float64(r * r)
	c := r - float64(t*(expP1+float64(t*(expP2+float64(t*(expP3+float64(t*(expP4+float64(t*expP5)))))))))
	y := 1 - ((lo - float64(r*c)/(2-c)) - hi)
	if k < -1021 || k > 1023 {
		return math.Ldexp(y, k) // y·2^k is subnormal, or 2^k is not normal
	}
	// y is in [0.7, 1.5), so scaling by the normal 2^k is exact.
	return y * math.Float64frombits(uint64(k+1023)<<52)
}

// Coefficients of s_erf.c: erf on [0, 0.84375) is x + x·pp(x²)/qq(x²);
// on [0.84375, 1.25) erx + pa(s)/qa(s) with s = x-1; beyond, 1 - e^(…)/x
// with the ra/sa (x < 1/0.35) or rb/sb pair in 1/x².
var (
	erfPP = []float64{1.28379167095512558561e-01, -3.25042107247001499370e-01, -2.84817495755985104766e-02,
		-5.77027029648944159157e-03, -2.37630166566501626084e-05}
	erfQQ = []float64{1, 3.97917223959155352819e-01, 6.50222499887672944485e-02, 5.08130628187576562776e-03,
		1.32494738004321644526e-04, -3.96022827877536812320e-06}
	erfPA = []float64{-2.36211856075265944077e-03, 4.14856118683748331666e-01, -3.72207876035701323847e-01,
		3.18346619901161753674e-01, -1.10894694282396677476e-01, 3.54783043256182359371e-02, -2.16637559486879084300e-03}
	erfQA = []float64{1, 1.06420880400844228286e-01, 5.40397917702171048937e-01, 7.18286544141962662868e-02,
		1.26171219808761642112e-01, 1.36370839120290507362e-02, 1.19844998467991074170e-02}
	erfRA = []float64{-9.86494403484714822705e-03, -6.93858572707181764372e-01, -1.05586262253232909814e+01,
		-6.23753324503260060396e+01, -1.62396669462573470355e+02, -1.84605092906711035994e+02,
		-8.12874355063065934246e+01, -9.81432934416914548592e+00}
	erfSA = []float64{1, 1.96512716674392571292e+01, 1.37657754143519042600e+02, 4.34565877475229228821e+02,
		6.45387271733267880336e+02, 4.29008140027567833386e+02, 1.08635005541779435134e+02,
		6.57024977031928170135e+00, -6.04244152148580987438e-02}
	erfRB = []float64{-9.86494292470009928597e-03, -7.99283237680523006574e-01, -1.77579549177547519889e+01,
		-1.60636384855821916062e+02, -6.37566443368389627722e+02, -1.02509513161107724954e+03,
		-4.83519191608651397019e+02}
	erfSB = []float64{1, 3.03380607434824582924e+01, 3.25792512996573918826e+02, 1.53672958608443695994e+03,
		3.19985821950859553908e+03, 2.55305040643316442583e+03, 4.74528541206955367215e+02,
		-2.24409524465858183362e+01}
)

// erf returns the error function of x.
func erf(x float64) float64 {
	const (
		erx   = 8.45062911510467529297e-01
		efx   = 1.28379167095512586316e-01
		small = 1.0 / (1 << 28)
	)
	if x != x {
		return x
	}
	ax := math.Abs(x)
	var r float64
	switch {
	case ax < small:
		// No underflow to care about: the kernels pass float32 values over
		// √2, at least 2^-150, where efx·ax is still exact enough.
		r = ax + float64(efx*ax)
	case ax < 0.84375:
		z := float64(ax * ax)
		r = ax + float64(ax*(poly(z, erfPP)/poly(z, erfQQ)))
	case ax < 1.25:
		s := ax - 1
		r = erx + poly(s, erfPA)/poly(s, erfQA)
	case ax >= 6:
		r = 1
	default:
		s := 1 / float64(ax*ax)
		var q float64
		if ax < 1/0.35 {
			q = poly(s, erfRA) / poly(s, erfSA)
		} else {
			q = poly(s, erfRB) / poly(s, erfSB)
		}
		// z is ax cut to 20 bits, so that z·z is exact.
		z := math.Float64frombits(math.Float64bits(ax) & 0xffffffff00000000)
		r = 1 - exp(float64(-z*z)-0.5625)*exp(float64((z-ax)*(z+ax))+q)/ax
	}
	return math.Copysign(r, x)
}
